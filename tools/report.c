/*
 * report.c - `nvio report [DIR]`: what this machine and a directory
 * support, from nvio_probe(), with the concrete fix for each missing piece.
 */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

static const char report_help[] =
"Usage: nvio report [OPTIONS] [DIR]\n"
"\n"
"Shows what this machine and DIR (default $TMPDIR or /tmp) support: each\n"
"I/O engine and why one cannot run, O_DIRECT and the alignment it needs,\n"
"the file system and device, RLIMIT_MEMLOCK and what it means for locked\n"
"buffers, CUDA and cuFile (GPUDirect Storage, true direct or compatibility\n"
"mode), and the tuned entry saved for DIR. Every missing piece comes with\n"
"the fix.\n"
"\n"
"Options:\n"
"  --dir DIR    same as the DIR argument\n"
"  --json       one JSON object on stdout\n"
"  -h, --help   this text\n";

struct report {
	const char *dir;
	nvio_probe_t p;
	char kernel[192];
	nvio_config_t def;	/* a default handle's resolved config */
	char def_note[256];
	int def_err;
	nvio_config_t tuned[2];	/* [for_write] */
	int tuned_found[2];
	char tuned_file[4096];
	char engine_why[NVIO_ENGINE_COUNT_][512];	/* uncut */
};

/* ---- the fixes ---- */

static int has(const char *s, const char *word)
{
	return strcasestr(s, word) != NULL;
}

/* The library's reason often carries its own fix already. */
static int says_fix(const char *why)
{
	return has(why, "install") || has(why, "rebuild") || has(why, "raise") ||
	       has(why, "run with") || has(why, "fix");
}

static const char *engine_fix(int e, const char *why)
{
	if (e == NVIO_ENGINE_URING) {
		if (has(why, "liburing") || has(why, "not built"))
			return "install liburing-dev (Debian/Ubuntu) or "
			       "liburing-devel (Fedora/RHEL) and rebuild nvio";
		if (has(why, "lacks") || has(why, "implemented"))
			return "io_uring needs Linux 5.1 or later (5.6+ "
			       "recommended); libaio is used meanwhile";
		/* EPERM: either cause looks the same from inside */
		return "on the host, 'sysctl kernel.io_uring_disabled' must be "
		       "0 (sysctl -w kernel.io_uring_disabled=0); in a "
		       "container, its seccomp profile must allow io_uring_setup, "
		       "io_uring_enter and io_uring_register (docker/podman: "
		       "--security-opt seccomp=PROFILE.json, or unconfined); "
		       "libaio is used meanwhile";
	}
	if (e == NVIO_ENGINE_AIO) {
		if (has(why, "libaio") || has(why, "not built"))
			return "install libaio-dev (Debian/Ubuntu) or "
			       "libaio-devel (Fedora/RHEL) and rebuild nvio";
		if (has(why, "EAGAIN") || has(why, "aio-max-nr"))
			return "raise /proc/sys/fs/aio-max-nr "
			       "(sysctl -w fs.aio-max-nr=1048576)";
		return "allow io_setup/io_submit/io_getevents in the seccomp "
		       "profile; psync always works";
	}
	return "psync only needs pread/pwrite; check the seccomp profile";
}

static const char *direct_fix(const nvio_probe_t *p)
{
	if (!strcmp(p->fs_type, "tmpfs"))
		return "tmpfs takes O_DIRECT only from Linux 6.6; put the "
		       "files on ext4 or xfs on the NVMe device";
	return "this file system refuses O_DIRECT (overlayfs, some FUSE "
	       "and network file systems): use ext4 or xfs on the device; "
	       "--direct auto falls back to the page cache meanwhile";
}

static const char memlock_fix[] =
	"raise it: 'ulimit -l unlimited' (as root), '* - memlock unlimited' in "
	"/etc/security/limits.conf, LimitMEMLOCK=infinity for systemd services, "
	"'docker run --ulimit memlock=-1'";

static const char *cuda_fix(const nvio_probe_t *p)
{
	if (p->cuda_found)
		return NULL;
	return "install the NVIDIA driver (libcuda.so.1 on the loader path: "
	       "ldconfig -p | grep libcuda, or LD_LIBRARY_PATH); in containers "
	       "use --gpus all with the NVIDIA Container Toolkit";
}

static const char *cufile_fix(const nvio_probe_t *p)
{
	switch (p->cufile_mode) {
	case NVIO_CUFILE_DIRECT:
		return NULL;
	case NVIO_CUFILE_COMPAT:
		return "true GPUDirect needs the nvidia-fs kernel module "
		       "(package nvidia-fs-dkms, modprobe nvidia_fs) and ext4/xfs "
		       "on local NVMe; check with 'gdscheck -p'; compatibility "
		       "mode is governed by allow_compat_mode in /etc/cufile.json "
		       "(or the file CUFILE_ENV_PATH_JSON names)";
	case NVIO_CUFILE_UNKNOWN:
		return "libcufile loaded but its driver did not open: it needs "
		       "a CUDA device and driver (see CUDA above)";
	default:
		return "install GPUDirect Storage (package nvidia-gds, which "
		       "provides libcufile.so.0) and put its directory (e.g. "
		       "/usr/local/cuda/lib64) on LD_LIBRARY_PATH; nvio stages "
		       "GPU buffers through host memory meanwhile";
	}
}

static const char *cufile_mode_name(int m)
{
	static const char *names[] = { "none", "direct", "compat", "unknown" };

	return m >= 0 && m <= 3 ? names[m] : "unknown";
}

static int memlock_limited(const nvio_probe_t *p)
{
	return p->memlock_cur != UINT64_MAX && !p->can_lock_unlimited;
}

/* ---- gathering ---- */

static void gather_default_handle(struct report *r)
{
	nvio_handle_t *h = NULL;

	nvio_config_init(&r->def);
	r->def_err = nvio_handle_create(&h, NULL);
	if (r->def_err)
		return;
	r->def.struct_size = sizeof(r->def);
	nvio_handle_config(h, &r->def);
	snprintf(r->def_note, sizeof(r->def_note), "%s",
		 nvio_get_engine_note(h) ? nvio_get_engine_note(h) : "");
	nvio_handle_destroy(h);
}

static int gather(struct report *r)
{
	struct utsname u;
	int e;

	r->p.struct_size = sizeof(r->p);
	e = nvio_probe(r->dir, &r->p);
	if (e < 0) {
		msg("%s: %s", r->dir, nvio_strerror(e));
		return EXIT_RUNTIME;
	}
	if (!uname(&u))
		snprintf(r->kernel, sizeof(r->kernel), "%s %s", u.sysname,
			 u.release);
	/* the probe's reasons are cut at 160 bytes; ask again in full */
	for (int k = NVIO_ENGINE_URING; k < NVIO_ENGINE_COUNT_; k++) {
		snprintf(r->engine_why[k], sizeof(r->engine_why[k]), "%s",
			 r->p.engine_why[k]);
		if (!r->p.engine_ok[k])
			nvio_engine_available(k, r->engine_why[k],
					      sizeof(r->engine_why[k]));
	}
	gather_default_handle(r);
	tuned_file_path(r->tuned_file, sizeof(r->tuned_file));
	for (int w = 0; w < 2; w++) {
		nvio_config_init(&r->tuned[w]);
		r->tuned_found[w] = nvio_config_load_tuned(&r->tuned[w],
							   r->dir, w) == 1;
	}
	return 0;
}

/* ---- text ---- */

static void text_engines(const struct report *r)
{
	char cfg[512];

	printf("Engines (kernel %s):\n", r->kernel);
	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++) {
		const char *why = r->engine_why[e];

		if (r->p.engine_ok[e]) {
			printf("  %-9s yes%s%s\n", nvio_engine_name(e),
			       *why ? "  " : "", why);
			continue;
		}
		printf("  %-9s NO: %s\n", nvio_engine_name(e),
		       *why ? why : "unavailable");
		if (!says_fix(why) || e == NVIO_ENGINE_URING)
			printf("            fix: %s\n", engine_fix(e, why));
	}
	if (r->def_err)
		printf("  default handle: cannot be created: %s\n",
		       handle_error_text(&r->def, r->def_err, cfg, sizeof(cfg)));
	else
		printf("  default handle: %s\n    %s\n",
		       config_text(&r->def, cfg, sizeof(cfg)), r->def_note);
	for (int i = 0; i < 2; i++) {
		const char *name = i ? "NVIO_DIRECT" : "NVIO_ENGINE";
		const char *v = getenv(name);

		if (v)
			printf("  environment: %s=%s overrides every handle\n",
			       name, v);
	}
}

static void text_dir(const struct report *r)
{
	const nvio_probe_t *p = &r->p;
	char b[32], why[512];

	printf("\nDirectory %s:\n", r->dir);
	printf("  file system   %s on %s\n", *p->fs_type ? p->fs_type : "?",
	       *p->device ? p->device : "(no block device)");
	printf("  free space    %s\n",
	       fmt_bytes(p->fs_free_bytes, b, sizeof(b)));
	if (p->dio_offset_align)
		printf("  block size    %u bytes logical (O_DIRECT offsets and "
		       "lengths), %u bytes file system (st_blksize)\n",
		       p->dio_offset_align, p->fs_block_size);
	else
		printf("  block size    %u bytes file system (st_blksize); no "
		       "O_DIRECT alignment reported\n", p->fs_block_size);
	if (p->direct_ok != 1 &&
	    direct_untested_why(r->dir, p, why, sizeof(why))) {
		printf("  O_DIRECT      %s\n", why);
	} else if (probe_in_memory(p)) {
		printf("  O_DIRECT      %s: %s keeps files in memory (page cache "
		       "only), so there is no device to reach directly and no "
		       "alignment to keep; for device speed use ext4 or xfs on "
		       "the NVMe device\n", p->direct_ok == 1 ?
		       "accepted, but does not bypass the page cache" :
		       "NOT supported", p->fs_type);
	} else if (p->direct_ok == 1) {
		printf("  O_DIRECT      yes: buffers aligned to %u bytes, offsets "
		       "and lengths to %u bytes\n",
		       p->dio_mem_align, p->dio_offset_align);
	} else {
		printf("  O_DIRECT      NO: %s\n",
		       p->direct_err ? nvio_strerror(p->direct_err) : "refused");
		printf("                fix: %s\n", direct_fix(p));
	}
}

static void text_tuned(const struct report *r)
{
	char cfg[256];

	printf("  tuned entry   %s\n", r->tuned_file);
	for (int w = 0; w < 2; w++)
		printf("    %-5s       %s\n", w ? "write" : "read",
		       r->tuned_found[w] ? config_text(&r->tuned[w], cfg,
						       sizeof(cfg))
					 : "none (run 'nvio tune')");
	if (getenv("NVIO_NO_TUNED"))
		printf("    NVIO_NO_TUNED is set: tuned entries are ignored\n");
}

static void text_memlock(const nvio_probe_t *p)
{
	char a[32], b[32];

	printf("\nLocked memory:\n");
	if (p->memlock_cur == UINT64_MAX)
		printf("  RLIMIT_MEMLOCK unlimited\n");
	else
		printf("  RLIMIT_MEMLOCK %s (hard limit %s)\n",
		       fmt_bytes(p->memlock_cur, a, sizeof(a)),
		       p->memlock_max == UINT64_MAX ? "unlimited"
			: fmt_bytes(p->memlock_max, b, sizeof(b)));
	if (!memlock_limited(p)) {
		printf("  locked buffers of any size can be had%s\n",
		       p->memlock_cur != UINT64_MAX ? " (CAP_IPC_LOCK)" : "");
		return;
	}
	printf("  nvio_mem_alloc locks at most %s in all; larger buffers come "
	       "back page aligned but unlocked (slower staging, and pinned "
	       "memory for GPUs fails)\n", fmt_bytes(p->memlock_cur, a, sizeof(a)));
	printf("  fix: %s\n", memlock_fix);
}

static void text_cuda(const nvio_probe_t *p)
{
	const char *fix;

	printf("\nCUDA:\n");
	if (p->cuda_found)
		printf("  driver        found: %d device(s), driver version "
		       "%d.%d\n", p->cuda_device_count,
		       p->cuda_driver_version / 1000,
		       p->cuda_driver_version % 1000 / 10);
	else
		printf("  driver        NOT found: %s\n",
		       *p->cuda_why ? p->cuda_why : "libcuda.so.1 not loaded");
	if ((fix = cuda_fix(p)) && !says_fix(p->cuda_why))
		printf("                fix: %s\n", fix);
	printf("  cuFile (GDS)  %s%s%s\n",
	       p->cufile_mode == NVIO_CUFILE_DIRECT ? "true direct mode" :
	       p->cufile_mode == NVIO_CUFILE_COMPAT ? "compatibility mode" :
	       p->cufile_found ? "loaded, mode unknown" : "NOT found",
	       *p->cufile_why ? ": " : "", p->cufile_why);
	if ((fix = cufile_fix(p)) && !says_fix(p->cufile_why))
		printf("                fix: %s\n", fix);
}

static void report_text(const struct report *r)
{
	printf("nvio report (libnvio %s)\n\n", nvio_version_string());
	text_engines(r);
	text_dir(r);
	text_tuned(r);
	text_memlock(&r->p);
	text_cuda(&r->p);
}

/* ---- JSON ---- */

static void json_engines(struct json *j, const struct report *r)
{
	json_obj(j, "engines");
	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++) {
		int ok = r->p.engine_ok[e] == 1;

		json_obj(j, nvio_engine_name(e));
		json_bool(j, "available", ok);
		json_str(j, "why", r->engine_why[e]);
		json_str(j, "fix", ok ? NULL : engine_fix(e, r->engine_why[e]));
		json_close(j, '}');
	}
	json_close(j, '}');
	if (r->def_err) {
		char why[512];

		json_null(j, "default_handle");
		json_str(j, "default_handle_error",
			 handle_error_text(&r->def, r->def_err, why, sizeof(why)));
	} else {
		config_json(j, "default_handle", &r->def);
		json_str(j, "engine_note", r->def_note);
	}
	json_obj(j, "environment");
	json_str(j, "NVIO_ENGINE", getenv("NVIO_ENGINE"));
	json_str(j, "NVIO_DIRECT", getenv("NVIO_DIRECT"));
	json_str(j, "NVIO_NO_TUNED", getenv("NVIO_NO_TUNED"));
	json_str(j, "NVIO_TUNED_FILE", getenv("NVIO_TUNED_FILE"));
	json_close(j, '}');
}

static void json_dir(struct json *j, const struct report *r)
{
	const nvio_probe_t *p = &r->p;
	char why[512];

	json_obj(j, "fs");
	json_str(j, "type", p->fs_type);
	json_str(j, "device", p->device);
	json_uint(j, "block_size", p->fs_block_size);
	json_uint(j, "free_bytes", p->fs_free_bytes);
	json_close(j, '}');
	json_obj(j, "direct");
	json_bool(j, "ok", p->direct_ok == 1);
	json_bool(j, "bypasses_page_cache", p->direct_ok == 1 &&
		  !probe_in_memory(p));
	json_str(j, "error", p->direct_ok == 1 || !p->direct_err ? NULL
			     : nvio_strerror(p->direct_err));
	json_uint(j, "mem_align", p->dio_mem_align);
	json_uint(j, "offset_align", p->dio_offset_align);
	json_str(j, "untested", direct_untested_why(r->dir, p, why,
						    sizeof(why)));
	json_str(j, "fix", p->direct_ok == 1 ? NULL : direct_fix(p));
	json_close(j, '}');
	json_obj(j, "tuned");
	json_str(j, "file", r->tuned_file);
	for (int w = 0; w < 2; w++) {
		if (r->tuned_found[w])
			config_json(j, w ? "write" : "read", &r->tuned[w]);
		else
			json_null(j, w ? "write" : "read");
	}
	json_close(j, '}');
}

static void json_limit(struct json *j, const char *key, uint64_t v)
{
	if (v == UINT64_MAX)
		json_null(j, key);	/* unlimited */
	else
		json_uint(j, key, v);
}

static void json_gpu(struct json *j, const nvio_probe_t *p)
{
	int limited = memlock_limited(p);

	json_obj(j, "memlock");
	json_limit(j, "cur", p->memlock_cur);
	json_limit(j, "max", p->memlock_max);
	json_bool(j, "unlimited", p->memlock_cur == UINT64_MAX);
	json_bool(j, "can_lock_unlimited", p->can_lock_unlimited);
	json_str(j, "meaning", limited ?
		 "locked buffers beyond the limit come back unlocked" :
		 "locked buffers of any size");
	json_str(j, "fix", limited ? memlock_fix : NULL);
	json_close(j, '}');
	json_obj(j, "cuda");
	json_bool(j, "found", p->cuda_found);
	json_int(j, "device_count", p->cuda_device_count);
	json_int(j, "driver_version", p->cuda_driver_version);
	json_str(j, "why", p->cuda_why);
	json_str(j, "fix", cuda_fix(p));
	json_close(j, '}');
	json_obj(j, "cufile");
	json_bool(j, "found", p->cufile_found);
	json_str(j, "mode", cufile_mode_name(p->cufile_mode));
	json_str(j, "why", p->cufile_why);
	json_str(j, "fix", cufile_fix(p));
	json_close(j, '}');
}

static void report_json(const struct report *r)
{
	struct json j;

	json_begin(&j, stdout);
	json_str(&j, "version", nvio_version_string());
	json_str(&j, "kernel", r->kernel);
	json_str(&j, "dir", r->dir);
	json_engines(&j, r);
	json_dir(&j, r);
	json_gpu(&j, &r->p);
	json_end(&j);
}

int cmd_report(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, 0, 'd' },
		{ "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 }
	};
	static struct report r;
	int c, as_json = 0, e;

	opterr = 0;
	r.dir = NULL;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(report_help, stdout);
			return 0;
		} else if (c == 'j') {
			as_json = 1;
		} else if (c == 'd') {
			if (r.dir)
				usage_error("give one directory");
			r.dir = optarg;
		} else {
			bad_option(argv, c);
		}
	}
	if (optind < argc && (r.dir || optind + 1 < argc))
		usage_error("give one directory");
	if (optind < argc)
		r.dir = argv[optind];
	if (!r.dir)
		r.dir = default_dir();
	if ((e = check_dir(r.dir, 0)))
		return e;
	if ((e = gather(&r)))
		return e;
	if (as_json)
		report_json(&r);
	else
		report_text(&r);
	return 0;
}

/*
 * hopts.c - the handle options bench and tune share, and the checks on
 * --dir arguments.
 */
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

const char handle_opts_help[] =
"Handle options (the defaults are nvio's, or the tuned entry for the\n"
"first --dir when none of the tunable ones is given):\n"
"  --block-size SIZE        bytes per I/O request (default 1M)\n"
"  --queue-depth N          requests in flight per worker (default 128)\n"
"  --parallelism N          worker threads, DeepSpeed's intra_op_parallelism\n"
"                           (alias --intra-op-parallelism; default 1)\n"
"  --single-submit, --no-single-submit\n"
"                           one submission per request, or batched (default)\n"
"  --overlap-events, --no-overlap-events (alias --sequential-requests)\n"
"                           sliding window, or batch at a time (default)\n"
"  --engine E               auto, io_uring, libaio or psync (default auto)\n"
"  --direct auto|on|off     O_DIRECT policy (default auto)\n"
"  --staging-bytes SIZE     bounce memory per worker (default: block size x\n"
"                           queue depth, at most 128M)\n";

void handle_opts_init(struct handle_opts *o)
{
	memset(o, 0, sizeof(*o));
	nvio_config_init(&o->cfg);
}

static int parse_engine(const char *arg)
{
	int e = nvio_engine_from_name(arg);

	if (e < 0)
		usage_error("--engine %s: unknown engine (auto, io_uring, "
			    "libaio or psync)", arg);
	return e;
}

static int parse_direct(const char *arg)
{
	int d = nvio_direct_from_name(arg);

	if (d < 0)
		usage_error("--direct %s: use auto, on or off", arg);
	return d;
}

int handle_opt(struct handle_opts *o, int c, const char *arg)
{
	nvio_config_t *cfg = &o->cfg;

	switch (c) {
	case OPT_BLOCK_SIZE:
		cfg->block_size = opt_size("--block-size", arg, 512, 1ull << 30);
		break;
	case OPT_QUEUE_DEPTH:
		cfg->queue_depth = (uint32_t)opt_u64("--queue-depth", arg, 1,
						     NVIO_MAX_QUEUE_DEPTH);
		break;
	case OPT_PARALLELISM:
		cfg->intra_op_parallelism = (uint32_t)opt_u64("--parallelism",
					arg, 1, NVIO_MAX_PARALLELISM);
		break;
	case OPT_SINGLE_SUBMIT:
	case OPT_NO_SINGLE_SUBMIT:
		cfg->single_submit = c == OPT_SINGLE_SUBMIT;
		break;
	case OPT_OVERLAP:
	case OPT_NO_OVERLAP:
		cfg->overlap_events = c == OPT_OVERLAP;
		break;
	case OPT_ENGINE:
		cfg->engine = parse_engine(arg);
		break;
	case OPT_DIRECT:
		cfg->direct = parse_direct(arg);
		return 1;
	case OPT_STAGING:
		cfg->staging_bytes = opt_size("--staging-bytes", arg, 4096,
					      1ull << 34);
		return 1;
	default:
		return 0;
	}
	o->tunables_set = 1;
	return 1;
}

const char *default_dir(void)
{
	const char *t = getenv("TMPDIR");

	return t && *t ? t : "/tmp";
}

int check_dir(const char *dir, int need_write)
{
	struct stat st;

	if (stat(dir, &st)) {
		int e = errno;

		msg("--dir %s: %s", dir, strerror(e));
		return e == ENOENT || e == ENOTDIR ? EXIT_USAGE : EXIT_RUNTIME;
	}
	if (!S_ISDIR(st.st_mode)) {
		msg("--dir %s: %s", dir, strerror(ENOTDIR));
		return EXIT_USAGE;
	}
	if (need_write && access(dir, W_OK | X_OK)) {
		msg("--dir %s: not writable: %s", dir, strerror(errno));
		return EXIT_RUNTIME;
	}
	return 0;
}

uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

void tuned_file_path(char *buf, size_t len)
{
	const char *f = getenv("NVIO_TUNED_FILE"), *x, *home;

	if (f && *f) {
		snprintf(buf, len, "%s", f);
		return;
	}
	x = getenv("XDG_CONFIG_HOME");
	home = getenv("HOME");
	if (x && *x)
		snprintf(buf, len, "%s/nvio/tuned.conf", x);
	else
		snprintf(buf, len, "%s/.config/nvio/tuned.conf",
			 home ? home : "~");
}

/* The value of an NVIO_* variable that applies, or NULL when unset/empty. */
static const char *env_set(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

const char *handle_error_text(const nvio_config_t *cfg, int err, char *buf,
			      size_t len)
{
	const char *ev = env_set("NVIO_ENGINE"), *dv = env_set("NVIO_DIRECT");
	int engine = cfg->engine;
	char why[256] = "";

	/* the library applies the environment only to what is left at auto */
	if (cfg->engine == NVIO_ENGINE_AUTO && ev) {
		if (nvio_engine_from_name(ev) < 0) {
			snprintf(buf, len, "NVIO_ENGINE=%s in the environment is "
				 "not an engine (auto, io_uring, libaio or "
				 "psync): unset NVIO_ENGINE to let nvio choose",
				 ev);
			return buf;
		}
		engine = nvio_engine_from_name(ev);
	}
	if (cfg->direct == NVIO_DIRECT_AUTO && dv &&
	    nvio_direct_from_name(dv) < 0) {
		snprintf(buf, len, "NVIO_DIRECT=%s in the environment is not "
			 "auto, on or off: unset NVIO_DIRECT", dv);
		return buf;
	}
	if (engine != NVIO_ENGINE_AUTO &&
	    nvio_engine_available(engine, why, sizeof(why)) == 1)
		why[0] = '\0';
	if (cfg->engine == NVIO_ENGINE_AUTO && ev)
		snprintf(buf, len, "engine %s, set by NVIO_ENGINE in the "
			 "environment: %s%s%s; unset NVIO_ENGINE to let nvio "
			 "choose an engine that runs here", ev,
			 nvio_strerror(err), *why ? ": " : "", why);
	else
		snprintf(buf, len, "engine %s: %s%s%s",
			 nvio_engine_name(engine) ? nvio_engine_name(engine) : "?",
			 nvio_strerror(err), *why ? ": " : "", why);
	return buf;
}

const char *env_direct_hint(int direct_in_force)
{
	static char buf[160];
	const char *dv = env_set("NVIO_DIRECT");

	if (!dv || nvio_direct_from_name(dv) != direct_in_force ||
	    direct_in_force == NVIO_DIRECT_AUTO)
		return NULL;
	snprintf(buf, sizeof(buf), "NVIO_DIRECT=%s in the environment chose "
		 "this direct mode: unset NVIO_DIRECT to let nvio decide", dv);
	return buf;
}

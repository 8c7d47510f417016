/*
 * bench.c - `nvio bench`: bandwidth of N-byte transfers between memory and
 * files (one file per --dir, striped), like DeepSpeed's ds_io, optionally
 * side by side with fio in the same rounds.
 */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char bench_help[] =
"Usage: nvio bench [OPTIONS]\n"
"\n"
"Measures the bandwidth of --size byte transfers from memory to files\n"
"(write) and back (read). Several --dir stripe the buffer over one file\n"
"per directory, as over separate drives: all ranges are submitted\n"
"asynchronously on one handle and finished by one wait. Writes end with\n"
"fsync (like fio --end_fsync=1); reads start cold (O_DIRECT, or the page\n"
"cache dropped when permitted). Prints GB/s (GB = 10^9 bytes) and latency\n"
"as min/median/max over the loops, and CPU seconds per GB (user+sys).\n"
"\n"
"Options:\n"
"  --dir DIR            directory for the test file; repeat for striping\n"
"                       (default $TMPDIR or /tmp)\n"
"  --size SIZE          bytes per transfer, K/M/G/T binary (default 1G)\n"
"  --read, --write      only reads (of a file written first, untimed) or\n"
"                       only writes; default both, write then read\n"
"  --loops N            timed rounds (default 5)\n"
"  --warmup N           untimed rounds first (default 1)\n"
"  --mem locked|pageable\n"
"                       locked: page-aligned locked memory from\n"
"                       nvio_mem_alloc (default); pageable: malloc'd and\n"
"                       deliberately not page aligned (the staging path)\n"
"  --gpu[=N]            the buffer is device memory of CUDA device N\n"
"                       (default 0), moved through locked bounce buffers\n"
"  --gds[=N]            like --gpu, on a GDS handle: cuFile moves it where\n"
"                       usable (nvio report says), else the bounce path\n"
"  --no-tuned           ignore the entry `nvio tune` saved for the first\n"
"                       --dir (NVIO_NO_TUNED=1 does the same)\n"
"  --compare fio        run fio on the same files in the same rounds (best\n"
"                       of 4 jobs per round) and print nvio/fio ratios\n"
"  --json               one JSON object on stdout\n"
"  -q, --quiet          no progress line on stderr (it is only shown when\n"
"                       stderr is a terminal)\n"
"  -h, --help           this text\n"
"\n";

#define DEFAULT_SIZE (1ull << 30)
#define MAX_LOOPS 10000

struct bench_opts {
	char *dirs[MAX_DIRS];
	int ndirs;
	uint64_t size;
	int do_read, do_write;
	int loops, warmup;
	struct handle_opts h;
	enum mem_kind mem;
	int no_tuned, json, quiet, fio;
};

/* One direction: its handle and what each timed round measured. */
struct series {
	int is_write;
	nvio_config_t cfg;	/* resolved */
	int tuned;		/* the tuned entry was applied */
	char note[256];
	nvio_handle_t *h;
	int n;
	double *secs, *cpu;
	double *fio_gbps, *fio_cpu, *ratio;
	int *fio_best;		/* index of the round's best fio job */
};

struct bench {
	struct bench_opts o;
	nvio_probe_t probes[MAX_DIRS];
	struct xfer x;
	enum cold cold;
	struct series s[2];	/* [is_write] */
	struct fio_ctx fio;
};

/* bench --compare fio: the sweep BENCHMARKING.md suggests. */
static const struct fio_job fio_jobs[] = {
	{ 1u << 20, 32, 1 },
	{ 1u << 20, 32, 2 },
	{ 8u << 20, 128, 2 },
	{ 128u << 10, 64, 1 },
};
#define NFIO_JOBS ((int)(sizeof(fio_jobs) / sizeof(fio_jobs[0])))

enum { OPT_DIR = OPT_HANDLE_LAST_, OPT_SIZE, OPT_READ, OPT_WRITE, OPT_LOOPS,
       OPT_WARMUP, OPT_MEM, OPT_GPU, OPT_GDS, OPT_NO_TUNED, OPT_JSON, OPT_COMPARE };

static const struct option bench_longopts[] = {
	{ "dir", required_argument, 0, OPT_DIR },
	{ "size", required_argument, 0, OPT_SIZE },
	{ "read", no_argument, 0, OPT_READ },
	{ "write", no_argument, 0, OPT_WRITE },
	{ "loops", required_argument, 0, OPT_LOOPS },
	{ "warmup", required_argument, 0, OPT_WARMUP },
	{ "mem", required_argument, 0, OPT_MEM },
	{ "gpu", optional_argument, 0, OPT_GPU },
	{ "gds", optional_argument, 0, OPT_GDS },
	{ "no-tuned", no_argument, 0, OPT_NO_TUNED },
	{ "json", no_argument, 0, OPT_JSON },
	{ "compare", required_argument, 0, OPT_COMPARE },
	{ "quiet", no_argument, 0, 'q' },
	{ "help", no_argument, 0, 'h' },
	HANDLE_LONGOPTS,
	{ 0, 0, 0, 0 }
};

static void add_dir(struct bench_opts *o, char *dir)
{
	if (o->ndirs == MAX_DIRS)
		usage_error("--dir: at most %d directories", MAX_DIRS);
	for (int i = 0; i < o->ndirs; i++)
		if (!strcmp(o->dirs[i], dir))
			usage_error("--dir %s given twice", dir);
	o->dirs[o->ndirs++] = dir;
}

static void bench_opt(struct bench_opts *o, int c, char **argv)
{
	switch (c) {
	case OPT_DIR: add_dir(o, optarg); break;
	case OPT_SIZE: o->size = opt_size("--size", optarg, 1, 1ull << 50); break;
	case OPT_READ: o->do_read = 1; break;
	case OPT_WRITE: o->do_write = 1; break;
	case OPT_LOOPS:
		o->loops = (int)opt_u64("--loops", optarg, 1, MAX_LOOPS);
		break;
	case OPT_WARMUP:
		o->warmup = (int)opt_u64("--warmup", optarg, 0, MAX_LOOPS);
		break;
	case OPT_MEM:
		if (strcmp(optarg, "locked") && strcmp(optarg, "pageable"))
			usage_error("--mem %s: use locked or pageable", optarg);
		o->mem = strcmp(optarg, "locked") ? MEM_PAGEABLE : MEM_LOCKED;
		break;
	case OPT_GPU: gpu_option(&o->mem, optarg, 0); break;
	case OPT_GDS: gpu_option(&o->mem, optarg, 1); break;
	case OPT_NO_TUNED: o->no_tuned = 1; break;
	case OPT_JSON: o->json = 1; break;
	case OPT_COMPARE:
		if (strcmp(optarg, "fio"))
			usage_error("--compare %s: only fio is supported", optarg);
		o->fio = 1;
		break;
	case 'q': o->quiet = 1; break;
	default:
		if (!handle_opt(&o->h, c, optarg))
			bad_option(argv, c);
	}
}

static void bench_parse(struct bench_opts *o, int argc, char **argv)
{
	int c;

	memset(o, 0, sizeof(*o));
	handle_opts_init(&o->h);
	o->size = DEFAULT_SIZE;
	o->loops = 5;
	o->warmup = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hq", bench_longopts, NULL)) != -1) {
		if (c == 'h') {
			fputs(bench_help, stdout);
			fputs(handle_opts_help, stdout);
			exit(0);
		}
		bench_opt(o, c, argv);
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (!o->do_read && !o->do_write)
		o->do_read = o->do_write = 1;
	if (!o->ndirs)
		o->dirs[o->ndirs++] = (char *)default_dir();
	if (o->size < 4096ull * (uint64_t)o->ndirs && o->ndirs > 1)
		usage_error("--size %llu: striping needs at least 4 KiB per --dir",
			    (unsigned long long)o->size);
}

/* ---- setting up ---- */

static int series_alloc(struct series *s, int n)
{
	s->secs = calloc((size_t)n, sizeof(double));
	s->cpu = calloc((size_t)n, sizeof(double));
	s->fio_gbps = calloc((size_t)n, sizeof(double));
	s->fio_cpu = calloc((size_t)n, sizeof(double));
	s->ratio = calloc((size_t)n, sizeof(double));
	s->fio_best = calloc((size_t)n, sizeof(int));
	return s->secs && s->cpu && s->fio_gbps && s->fio_cpu && s->ratio &&
	       s->fio_best ? 0 : -ENOMEM;
}

static void series_free(struct series *s)
{
	nvio_handle_destroy(s->h);
	free(s->secs);
	free(s->cpu);
	free(s->fio_gbps);
	free(s->fio_cpu);
	free(s->ratio);
	free(s->fio_best);
	memset(s, 0, sizeof(*s));
}

static const char *tuned_file(void)
{
	static char path[4096];

	tuned_file_path(path, sizeof(path));
	return path;
}

/* After an error under a tuned entry: where it came from, how to skip it. */
static void tuned_hint(const struct bench *b, const char *what)
{
	msg("%s came from the tuned entry for %s in %s: NVIO_NO_TUNED=1 or "
	    "--no-tuned ignores it", what, b->o.dirs[0], tuned_file());
}

/* The handle of one direction: the command line, else the tuned entry. */
static int series_open(struct bench *b, int is_write)
{
	struct series *s = &b->s[is_write];
	nvio_config_t cfg = b->o.h.cfg;
	const char *note;

	s->is_write = is_write;
	if (!b->o.h.tunables_set && !b->o.no_tuned) {
		int r = nvio_config_load_tuned(&cfg, b->o.dirs[0], is_write);

		if (r < 0)
			msg("warning: tuned entry for %s not used: %s: %s "
			    "(fix or remove that file; NVIO_NO_TUNED=1 or "
			    "--no-tuned ignores it)", b->o.dirs[0],
			    tuned_file(), nvio_strerror(r));
		s->tuned = r == 1;
	}
	s->h = handle_open(&cfg, is_write ? "write" : "read");
	if (!s->h) {
		if (s->tuned)
			tuned_hint(b, "this configuration");
		return EXIT_RUNTIME;
	}
	s->cfg.struct_size = sizeof(s->cfg);
	nvio_handle_config(s->h, &s->cfg);
	note = nvio_get_engine_note(s->h);
	snprintf(s->note, sizeof(s->note), "%s", note ? note : "");
	if (series_alloc(s, b->o.loops)) {
		msg("out of memory");
		return EXIT_RUNTIME;
	}
	return 0;
}

static int bench_prepare(struct bench *b)
{
	const struct bench_opts *o = &b->o;
	int e;

	for (int i = 0; i < o->ndirs; i++)
		if ((e = check_dir(o->dirs[i], 1)))
			return e;
	if ((e = probe_dirs(o->dirs, o->ndirs, b->probes)) ||
	    (e = check_fits(o->dirs, o->ndirs, b->probes, o->size)))
		return e;
	for (int w = 0; w < 2; w++)
		if ((w ? o->do_write : o->do_read) && (e = series_open(b, w)))
			return e;
	b->cold = cold_choose(o->h.cfg.direct, b->probes, o->ndirs);
	if (o->fio && fio_detect(&b->fio, &b->probes[0], b->cold == COLD_DIRECT))
		return EXIT_RUNTIME;
	return xfer_setup(&b->x, o->dirs, o->ndirs, o->size, o->mem, "bench");
}

/* --read alone: the file is written once, untimed. */
static int bench_make_file(struct bench *b)
{
	struct sample s;

	if (b->o.do_write)
		return 0;
	progress("%s: writing the file to read", tool_prog);
	return xfer_run(b->s[0].h, &b->x, 1, &s) ? EXIT_RUNTIME : 0;
}

/* ---- the rounds ---- */

/* fio's best job of this round for one direction; 0 or EXIT_RUNTIME. */
static int fio_round(struct bench *b, struct series *s, int rec)
{
	double best = 0, best_cpu = 0;
	int best_i = -1;

	for (int i = 0; i < NFIO_JOBS; i++) {
		double g, c;
		int r;

		if (!s->is_write)
			cold_prepare(b->cold);
		r = fio_run(&b->fio, &b->x, s->is_write, &fio_jobs[i], &g, &c);
		cleanup_check();
		if (r < 0)
			return EXIT_RUNTIME;
		if (r == 0 && g > best) {
			best = g;
			best_cpu = c;
			best_i = i;
		}
	}
	if (best_i < 0) {
		msg("fio: no job of the sweep fits --size");
		return EXIT_RUNTIME;
	}
	if (rec >= 0) {
		s->fio_gbps[rec] = best;
		s->fio_cpu[rec] = best_cpu;
		s->fio_best[rec] = best_i;
		s->ratio[rec] = (double)b->x.size / s->secs[rec] / GB / best;
	}
	return 0;
}

static int run_one(struct bench *b, struct series *s, int round, int rec)
{
	int total = b->o.warmup + b->o.loops;
	struct sample smp;

	if (!s->is_write)
		cold_prepare(b->cold);
	progress("%s: round %d/%d%s: %s", tool_prog, round + 1, total,
		 rec < 0 ? " (warmup)" : "", s->is_write ? "write" : "read");
	if (xfer_run(s->h, &b->x, s->is_write, &smp)) {
		cleanup_check();
		if (s->tuned)
			tuned_hint(b, "the handle's configuration");
		return EXIT_RUNTIME;
	}
	cleanup_check();
	if (rec >= 0) {
		s->secs[rec] = smp.secs;
		s->cpu[rec] = smp.cpu;
		s->n = rec + 1;
	}
	if (b->o.fio) {
		progress("%s: round %d/%d%s: %s, fio sweep", tool_prog,
			 round + 1, total, rec < 0 ? " (warmup)" : "",
			 s->is_write ? "write" : "read");
		return fio_round(b, s, rec);
	}
	return 0;
}

static int bench_rounds(struct bench *b)
{
	int total = b->o.warmup + b->o.loops, e;

	for (int i = 0; i < total; i++) {
		int rec = i < b->o.warmup ? -1 : i - b->o.warmup;

		for (int w = 1; w >= 0; w--)
			if (b->s[w].h && (e = run_one(b, &b->s[w], i, rec)))
				return e;
	}
	progress_done();
	return 0;
}

/* ---- results ---- */

struct summary {
	double gbps[3];		/* min, median, max */
	double lat[3];		/* seconds: min, median, max */
	double cpu_per_gb;
	double fio_gbps, fio_cpu_per_gb, ratio;	/* medians */
	int fio_job;		/* the job that won most rounds */
};

static void summarize(const struct bench *b, const struct series *s,
		      struct summary *m)
{
	double *v = malloc((size_t)s->n * sizeof(double));
	double cpu = 0, bytes = (double)b->x.size * s->n;
	int wins[NFIO_JOBS] = { 0 };

	memset(m, 0, sizeof(*m));
	if (!v || !s->n) {
		free(v);
		return;
	}
	for (int i = 0; i < s->n; i++) {
		v[i] = (double)b->x.size / s->secs[i] / GB;
		cpu += s->cpu[i];
	}
	m->gbps[0] = stat_min(v, s->n);
	m->gbps[2] = stat_max(v, s->n);
	m->gbps[1] = stat_median(v, s->n);
	memcpy(v, s->secs, (size_t)s->n * sizeof(double));
	m->lat[0] = stat_min(v, s->n);
	m->lat[2] = stat_max(v, s->n);
	m->lat[1] = stat_median(v, s->n);
	m->cpu_per_gb = cpu / (bytes / GB);
	if (b->o.fio) {
		memcpy(v, s->fio_gbps, (size_t)s->n * sizeof(double));
		m->fio_gbps = stat_median(v, s->n);
		memcpy(v, s->fio_cpu, (size_t)s->n * sizeof(double));
		m->fio_cpu_per_gb = stat_median(v, s->n);
		memcpy(v, s->ratio, (size_t)s->n * sizeof(double));
		m->ratio = stat_median(v, s->n);
		for (int i = 0; i < s->n; i++)
			wins[s->fio_best[i]]++;
		for (int i = 1; i < NFIO_JOBS; i++)
			if (wins[i] > wins[m->fio_job])
				m->fio_job = i;
	}
	free(v);
}

static const char *mem_text(const struct xfer *x)
{
	if (x->mem == MEM_GPU)
		return tool_handle_flags & NVIO_HANDLE_GDS ?
		       "CUDA device memory (nvio_cuda_alloc) on a GDS handle" :
		       "CUDA device memory (nvio_cuda_alloc), bounce path";
	if (x->mem == MEM_PAGEABLE)
		return "pageable (malloc, deliberately 64 bytes past a page "
		       "boundary: the staging path)";
	return x->locked ? "locked (nvio_mem_alloc, page aligned)"
			 : "page aligned but NOT locked: RLIMIT_MEMLOCK "
			   "refused (see nvio report)";
}

static void text_header(const struct bench *b)
{
	char sz[32], cfg[256];

	printf("nvio bench: %s per transfer (%llu bytes), %d dir%s, %d loops "
	       "after %d warmup\n", fmt_bytes(b->x.size, sz, sizeof(sz)),
	       (unsigned long long)b->x.size, b->o.ndirs,
	       b->o.ndirs > 1 ? "s (striped)" : "", b->o.loops, b->o.warmup);
	for (int i = 0; i < b->o.ndirs; i++)
		printf("  dir %s: %s on %s, O_DIRECT %s\n", b->o.dirs[i],
		       b->probes[i].fs_type, *b->probes[i].device ?
		       b->probes[i].device : "-",
		       probe_in_memory(&b->probes[i]) ?
		       "does not bypass the page cache here (files live in "
		       "memory)" : b->probes[i].direct_ok == 1 ? "yes" : "no");
	printf("  memory: %s\n", mem_text(&b->x));
	if (b->s[0].h)
		printf("  cold reads: %s\n", cold_text(b->cold));
	if (b->s[1].h)
		printf("  writes: each ends with fsync (NVIO_FSYNC), like fio "
		       "--end_fsync=1\n");
	for (int w = 1; w >= 0; w--) {
		const struct series *s = &b->s[w];

		if (!s->h)
			continue;
		printf("  %s handle: %s%s%s\n    %s\n", w ? "write" : "read",
		       config_text(&s->cfg, cfg, sizeof(cfg)),
		       s->tuned ? ", from the tuned entry for " : "",
		       s->tuned ? b->o.dirs[0] : "", s->note);
	}
}

static void text_fio(const struct bench *b, const struct summary *m)
{
	char job[64];

	printf("\n%s in the same rounds (ioengine=%s, direct=%d, "
	       "end_fsync=1 on writes), best of %d jobs per round:\n",
	       b->fio.version, b->fio.engine, b->fio.direct, NFIO_JOBS);
	printf("%-6s %10s %9s %9s %14s %8s  %s\n", "op", "nvio GB/s",
	       "fio GB/s", "nvio/fio", "CPU s/GB nvio", "fio",
	       "fio's best job (most rounds)");
	for (int w = 1; w >= 0; w--) {
		if (!b->s[w].h)
			continue;
		printf("%-6s %10.3f %9.3f %9.2f %14.3f %8.3f  %s\n",
		       w ? "write" : "read", m[w].gbps[1], m[w].fio_gbps,
		       m[w].ratio, m[w].cpu_per_gb, m[w].fio_cpu_per_gb,
		       fio_job_text(&fio_jobs[m[w].fio_job], job, sizeof(job)));
	}
	printf("GB/s are medians over the rounds; nvio/fio is the median of "
	       "the %d per-round ratios.\n", b->o.loops);
}

static void bench_text(const struct bench *b, const struct summary *m)
{
	text_header(b);
	printf("\n%-6s %-26s %-29s %s\n", "", "bandwidth GB/s (10^9 B/s)",
	       "latency ms", "CPU s");
	printf("%-6s %8s %8s %8s  %9s %9s %9s  %7s\n", "op", "min", "median",
	       "max", "min", "median", "max", "per GB");
	for (int w = 1; w >= 0; w--) {
		const struct summary *s = &m[w];

		if (!b->s[w].h)
			continue;
		printf("%-6s %8.3f %8.3f %8.3f  %9.2f %9.2f %9.2f  %7.3f\n",
		       w ? "write" : "read", s->gbps[0], s->gbps[1],
		       s->gbps[2], s->lat[0] * 1e3, s->lat[1] * 1e3,
		       s->lat[2] * 1e3, s->cpu_per_gb);
	}
	if (b->o.fio)
		text_fio(b, m);
}

static void json_triple(struct json *j, const char *key, const double *v)
{
	json_obj(j, key);
	json_num(j, "min", v[0]);
	json_num(j, "median", v[1]);
	json_num(j, "max", v[2]);
	json_close(j, '}');
}

static void json_fio(struct json *j,
		     const struct series *s, const struct summary *m)
{
	char job[64];

	json_obj(j, "fio");
	json_num(j, "gbps_median", m->fio_gbps);
	json_num(j, "cpu_s_per_gb", m->fio_cpu_per_gb);
	json_num(j, "ratio_median", m->ratio);
	json_str(j, "best_job", fio_job_text(&fio_jobs[m->fio_job], job,
					     sizeof(job)));
	json_arr(j, "rounds");
	for (int i = 0; i < s->n; i++) {
		json_obj(j, NULL);
		json_num(j, "gbps", s->fio_gbps[i]);
		json_num(j, "cpu_s_per_gb", s->fio_cpu[i]);
		json_num(j, "ratio", s->ratio[i]);
		json_str(j, "job", fio_job_text(&fio_jobs[s->fio_best[i]], job,
						sizeof(job)));
		json_close(j, '}');
	}
	json_close(j, ']');
	json_close(j, '}');
}

static void json_series(struct json *j, const struct bench *b,
			const struct series *s, const struct summary *m)
{
	json_obj(j, s->is_write ? "write" : "read");
	config_json(j, "config", &s->cfg);
	json_bool(j, "tuned", s->tuned);
	json_str(j, "engine_note", s->note);
	json_triple(j, "gbps", m->gbps);
	json_triple(j, "latency_s", m->lat);
	json_num(j, "cpu_s_per_gb", m->cpu_per_gb);
	json_arr(j, "rounds");
	for (int i = 0; i < s->n; i++) {
		json_obj(j, NULL);
		json_num(j, "secs", s->secs[i]);
		json_num(j, "gbps", (double)b->x.size / s->secs[i] / GB);
		json_num(j, "cpu_s", s->cpu[i]);
		json_close(j, '}');
	}
	json_close(j, ']');
	if (b->o.fio)
		json_fio(j, s, m);
	json_close(j, '}');
}

static void bench_json(const struct bench *b, const struct summary *m)
{
	struct json j;

	json_begin(&j, stdout);
	json_str(&j, "command", "bench");
	json_str(&j, "version", nvio_version_string());
	json_uint(&j, "size", b->x.size);
	json_arr(&j, "dirs");
	for (int i = 0; i < b->o.ndirs; i++)
		json_str(&j, NULL, b->o.dirs[i]);
	json_close(&j, ']');
	json_int(&j, "loops", b->o.loops);
	json_int(&j, "warmup", b->o.warmup);
	json_str(&j, "mem", b->x.mem == MEM_GPU ?
		 (tool_handle_flags & NVIO_HANDLE_GDS ? "gds" : "gpu") :
		 b->x.mem == MEM_PAGEABLE ? "pageable" : "locked");
	json_bool(&j, "mem_locked", b->x.locked);
	json_str(&j, "cold_reads", cold_name(b->cold));
	json_str(&j, "write_sync", "NVIO_FSYNC");
	json_num(&j, "gb_bytes", GB);
	if (b->o.fio) {
		json_obj(&j, "fio");
		json_str(&j, "version", b->fio.version);
		json_str(&j, "ioengine", b->fio.engine);
		json_int(&j, "direct", b->fio.direct);
		json_close(&j, '}');
	}
	for (int w = 1; w >= 0; w--)
		if (b->s[w].h)
			json_series(&j, b, &b->s[w], &m[w]);
	json_end(&j);
}

int cmd_bench(int argc, char **argv)
{
	static struct bench b;
	struct summary m[2];
	int e;

	bench_parse(&b.o, argc, argv);
	progress_init(b.o.quiet);
	cleanup_install();
	e = bench_prepare(&b);
	if (!e)
		e = bench_make_file(&b);
	if (!e)
		e = bench_rounds(&b);
	progress_done();
	if (!e) {
		for (int w = 0; w < 2; w++)
			summarize(&b, &b.s[w], &m[w]);
		if (b.o.json)
			bench_json(&b, m);
		else
			bench_text(&b, m);
	}
	for (int w = 0; w < 2; w++)
		series_free(&b.s[w]);
	xfer_teardown(&b.x);
	cleanup_remove_all();
	cleanup_check();
	return e;
}

/*
 * tune.c - `nvio tune`: finds the best handle configuration for a
 * directory, like DeepSpeed's ds_nvme_tune but by coordinate descent
 * instead of a full grid: block size first at a fixed middle
 * configuration, then queue depth, parallelism, submit/overlap modes and
 * engine, each walked in ascending order and cut short once it keeps
 * getting worse. Each direction (write, then read) is tuned on its own.
 */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char tune_help[] =
"Usage: nvio tune [OPTIONS]\n"
"\n"
"Finds the handle configuration with the best bandwidth for a directory by\n"
"coordinate descent: block size, then queue depth, parallelism,\n"
"submit/overlap modes and engine, each step keeping the best value found so\n"
"far. Writes are tuned first, then reads (cold: O_DIRECT or dropped page\n"
"cache). Prints the best read and write configurations as JSON, in nvio's\n"
"format and as a DeepSpeed \"aio\" block, and saves them with\n"
"nvio_config_save_tuned() as the defaults `nvio bench` and nvio users pick\n"
"up for this directory.\n"
"\n"
"Options:\n"
"  --dir DIR            the directory to tune (default $TMPDIR or /tmp)\n"
"  --size SIZE          bytes per measurement (default 256M)\n"
"  --time-budget SECS   stop exploring after this long (default 60)\n"
"  --repeat N           transfers per measured point, median (default 3)\n"
"  --read-only          tune reads only\n"
"  --write-only         tune writes only\n"
"  --direct auto|on|off O_DIRECT policy for every measurement\n"
"  --mem locked|pageable\n"
"                       buffer kind (default locked)\n"
"  --gpu[=N]            device memory of CUDA device N (default 0),\n"
"                       through the bounce path; implies --no-save\n"
"  --gds[=N]            the same on GDS handles (cuFile where usable)\n"
"  --plot FILE.svg      draw bandwidth over the explored space\n"
"  --no-save            print, but do not save the winners\n"
"  --json               one JSON object with every explored point\n"
"  -q, --quiet          no progress line on stderr (it is only shown when\n"
"                       stderr is a terminal)\n"
"  -h, --help           this text\n"
"\n"
"The winners go to $NVIO_TUNED_FILE, else $XDG_CONFIG_HOME/nvio/tuned.conf,\n"
"else ~/.config/nvio/tuned.conf, keyed by the directory's real path. Set\n"
"NVIO_NO_TUNED=1 (or use bench --no-tuned) to ignore them.\n";


struct tune_opts {
	char *dir;
	uint64_t size;
	double budget;
	int repeat;
	int do_read, do_write;
	int direct;
	enum mem_kind mem;
	const char *plot;
	int no_save, json, quiet;
};

struct tuner {
	struct tune_opts o;
	nvio_probe_t probe;
	struct xfer x;
	enum cold cold;
	struct tune_point *pts;
	int npts, cap;
	int transfers;
	double t0, deadline;
	int budget_hit;		/* in the current direction */
	int budget_reached;	/* in any */
	int engines[NVIO_ENGINE_COUNT_], nengines;
	int auto_engine;	/* what AUTO resolves to */
	nvio_config_t best[2];
	double best_gbps[2], default_gbps[2], cross_gbps[2];
	int tuned[2];
	int saved;
	char saved_file[4096];
};

enum { OPT_DIR = 2000, OPT_SIZE, OPT_BUDGET, OPT_REPEAT, OPT_READ_ONLY,
       OPT_WRITE_ONLY, OPT_TDIRECT, OPT_MEM, OPT_GPU, OPT_GDS, OPT_PLOT, OPT_NO_SAVE, OPT_JSON };

static const struct option tune_longopts[] = {
	{ "dir", required_argument, 0, OPT_DIR },
	{ "size", required_argument, 0, OPT_SIZE },
	{ "time-budget", required_argument, 0, OPT_BUDGET },
	{ "repeat", required_argument, 0, OPT_REPEAT },
	{ "read-only", no_argument, 0, OPT_READ_ONLY },
	{ "write-only", no_argument, 0, OPT_WRITE_ONLY },
	{ "direct", required_argument, 0, OPT_TDIRECT },
	{ "mem", required_argument, 0, OPT_MEM },
	{ "gpu", optional_argument, 0, OPT_GPU },
	{ "gds", optional_argument, 0, OPT_GDS },
	{ "plot", required_argument, 0, OPT_PLOT },
	{ "no-save", no_argument, 0, OPT_NO_SAVE },
	{ "json", no_argument, 0, OPT_JSON },
	{ "quiet", no_argument, 0, 'q' },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 }
};

static void tune_opt(struct tune_opts *o, int c, char **argv)
{
	switch (c) {
	case OPT_DIR:
		if (o->dir)
			usage_error("--dir: tune one directory at a time");
		o->dir = optarg;
		break;
	case OPT_SIZE:
		o->size = opt_size("--size", optarg, 1u << 20, 1ull << 50);
		break;
	case OPT_BUDGET:
		if (parse_double(optarg, &o->budget) || o->budget <= 0)
			usage_error("--time-budget %s: a positive number of "
				    "seconds", optarg);
		break;
	case OPT_REPEAT:
		o->repeat = (int)opt_u64("--repeat", optarg, 1, 100);
		break;
	case OPT_READ_ONLY: o->do_read = 1; break;
	case OPT_WRITE_ONLY: o->do_write = 1; break;
	case OPT_TDIRECT:
		o->direct = nvio_direct_from_name(optarg);
		if (o->direct < 0)
			usage_error("--direct %s: use auto, on or off", optarg);
		break;
	case OPT_MEM:
		if (strcmp(optarg, "locked") && strcmp(optarg, "pageable"))
			usage_error("--mem %s: use locked or pageable", optarg);
		o->mem = strcmp(optarg, "locked") ? MEM_PAGEABLE : MEM_LOCKED;
		break;
	/* the tuned file is for host memory: device runs do not save */
	case OPT_GPU: gpu_option(&o->mem, optarg, 0); o->no_save = 1; break;
	case OPT_GDS: gpu_option(&o->mem, optarg, 1); o->no_save = 1; break;
	case OPT_PLOT: o->plot = optarg; break;
	case OPT_NO_SAVE: o->no_save = 1; break;
	case OPT_JSON: o->json = 1; break;
	case 'q': o->quiet = 1; break;
	default: bad_option(argv, c);
	}
}

static void tune_parse(struct tune_opts *o, int argc, char **argv)
{
	int c;

	memset(o, 0, sizeof(*o));
	o->size = 256u << 20;
	o->budget = 60;
	o->repeat = 3;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hq", tune_longopts, NULL)) != -1) {
		if (c == 'h') {
			fputs(tune_help, stdout);
			exit(0);
		}
		tune_opt(o, c, argv);
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (o->do_read && o->do_write)
		usage_error("--read-only and --write-only exclude each other");
	if (!o->do_read && !o->do_write)
		o->do_read = o->do_write = 1;
	if (!o->dir)
		o->dir = (char *)default_dir();
}

/* ---- measuring ---- */

static int same_config(const nvio_config_t *a, const nvio_config_t *b)
{
	return a->block_size == b->block_size &&
	       a->queue_depth == b->queue_depth &&
	       a->intra_op_parallelism == b->intra_op_parallelism &&
	       a->single_submit == b->single_submit &&
	       a->overlap_events == b->overlap_events &&
	       a->engine == b->engine;
}

static double cached(const struct tuner *t, const nvio_config_t *c, int w)
{
	for (int i = 0; i < t->npts; i++)
		if (t->pts[i].is_write == w && same_config(&t->pts[i].cfg, c))
			return t->pts[i].gbps;
	return -1;
}

static int add_point(struct tuner *t, const nvio_config_t *c, int w,
		     int step, double gbps)
{
	if (t->npts == t->cap) {
		int cap = t->cap ? 2 * t->cap : 64;
		struct tune_point *p = realloc(t->pts, (size_t)cap * sizeof(*p));

		if (!p)
			return -1;
		t->pts = p;
		t->cap = cap;
	}
	memset(&t->pts[t->npts], 0, sizeof(t->pts[0]));
	t->pts[t->npts].is_write = w;
	t->pts[t->npts].step = step;
	t->pts[t->npts].cfg = *c;
	t->pts[t->npts].gbps = gbps;
	t->npts++;
	return 0;
}

/* GB/s of cfg: the median of --repeat transfers; < 0 on an error. */
static double transfer_gbps(struct tuner *t, const nvio_config_t *cfg, int w)
{
	double g[100];
	nvio_handle_t *h = handle_open(cfg, w ? "write" : "read");

	if (!h)
		return -1;
	for (int i = 0; i < t->o.repeat; i++) {
		struct sample s;

		if (!w)
			cold_prepare(t->cold);
		if (xfer_run(h, &t->x, w, &s)) {
			nvio_handle_destroy(h);
			cleanup_check();
			return -1;
		}
		cleanup_check();
		t->transfers++;
		g[i] = (double)t->x.size / s.secs / GB;
	}
	nvio_handle_destroy(h);
	return stat_median(g, t->o.repeat);
}

/*
 * Measures (or recalls) cfg for direction w and records it under step.
 * Returns GB/s; 0 when the time budget ran out first; < 0 on an error.
 */
static double measure(struct tuner *t, const nvio_config_t *cfg, int w,
		      int step)
{
	double g = cached(t, cfg, w);
	char label[64];

	if (g < 0) {
		if (step != ST_DEFAULT && now_s() > t->deadline) {
			t->budget_hit = 1;
			return 0;
		}
		progress("%s: %s, %s %s ... (best %.3f GB/s, %.0f s)",
			 tool_prog, w ? "write" : "read",
			 tune_step_names[step],
			 tune_point_label(cfg, step, label, sizeof(label)),
			 t->best_gbps[w], now_s() - t->t0);
		g = transfer_gbps(t, cfg, w);
		if (g < 0)
			return g;
	}
	if (add_point(t, cfg, w, step, g))
		return -1;
	if (g > t->best_gbps[w] && step != ST_DEFAULT && step != ST_CROSS) {
		t->best_gbps[w] = g;
		t->best[w] = *cfg;
	}
	return g;
}

/* ---- the descent ---- */

/*
 * Measures the candidates in order. Ordered steps (prune = 1) stop once
 * two values in a row are more than 10% below the best of this step:
 * the curve has passed its peak.
 */
static int walk(struct tuner *t, int w, int step, const nvio_config_t *cand,
		int n, int prune)
{
	double peak = 0;
	int worse = 0;

	for (int i = 0; i < n && !t->budget_hit; i++) {
		double g = measure(t, &cand[i], w, step);

		if (g < 0)
			return EXIT_RUNTIME;
		peak = g > peak ? g : peak;
		worse = g < 0.9 * peak ? worse + 1 : 0;
		if (prune && worse >= 2)
			break;
	}
	return 0;
}

static int step_block(struct tuner *t, int w, const nvio_config_t *cur)
{
	nvio_config_t c[8];
	int n = 0;
	uint64_t limit = t->x.size / 8 > (128u << 10) ? t->x.size / 8
						      : 128u << 10;

	for (uint64_t bs = 128u << 10; bs <= (16u << 20) && bs <= limit;
	     bs *= 2) {
		c[n] = *cur;
		c[n++].block_size = bs;
	}
	return walk(t, w, ST_BLOCK, c, n, 1);
}

static int step_depth(struct tuner *t, int w, const nvio_config_t *cur)
{
	nvio_config_t c[9];
	uint64_t blocks = t->x.size / cur->block_size /
			  cur->intra_op_parallelism;
	int n = 0;

	/* past the number of blocks a worker gets, depth changes nothing */
	for (uint32_t qd = 2; qd <= 256; qd *= 2) {
		c[n] = *cur;
		c[n++].queue_depth = qd;
		if (qd >= blocks)
			break;
	}
	return walk(t, w, ST_QD, c, n, 1);
}

static int step_parallel(struct tuner *t, int w, const nvio_config_t *cur)
{
	nvio_config_t c[4];
	int n = 0;

	for (uint32_t p = 1; p <= 8; p *= 2) {
		if (p > 1 && t->x.size / p < cur->block_size)
			break;
		c[n] = *cur;
		c[n++].intra_op_parallelism = p;
	}
	return walk(t, w, ST_PAR, c, n, 1);
}

static int step_modes(struct tuner *t, int w, const nvio_config_t *cur)
{
	nvio_config_t c[4];

	for (int i = 0; i < 4; i++) {
		c[i] = *cur;
		c[i].single_submit = (uint32_t)(i >> 1);
		c[i].overlap_events = (uint32_t)!(i & 1);
	}
	return walk(t, w, ST_MODES, c, 4, 0);
}

static int step_engine(struct tuner *t, int w, const nvio_config_t *cur)
{
	nvio_config_t c[NVIO_ENGINE_COUNT_];

	for (int i = 0; i < t->nengines; i++) {
		c[i] = *cur;
		c[i].engine = t->engines[i];
	}
	return walk(t, w, ST_ENGINE, c, t->nengines, 0);
}

static int tune_direction(struct tuner *t, int w)
{
	int (*const steps[])(struct tuner *, int, const nvio_config_t *) = {
		step_block, step_depth, step_parallel, step_modes, step_engine
	};
	nvio_config_t def, cur;
	int e;

	nvio_config_init(&def);
	def.direct = t->o.direct;
	def.engine = t->auto_engine;
	t->default_gbps[w] = measure(t, &def, w, ST_DEFAULT);
	if (t->default_gbps[w] < 0)
		return EXIT_RUNTIME;
	/* the fixed middle configuration block size is tuned at */
	cur = def;
	cur.queue_depth = 32;
	cur.intra_op_parallelism = 1;
	cur.single_submit = 0;
	cur.overlap_events = 1;
	/*
	 * A step cut short by the budget may have measured nothing: best[w]
	 * is then still all zeros (block size 0), so the descent stops here
	 * and the direction is reported as stopped, not tuned.
	 */
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		if ((e = steps[i](t, w, &cur)))
			return e;
		if (t->best_gbps[w] > 0)
			cur = t->best[w];
		if (t->budget_hit)
			break;
	}
	t->tuned[w] = t->best_gbps[w] > 0;
	return 0;
}

/* Each direction gets an equal share of what is left of the budget. */
static int tune_all(struct tuner *t)
{
	int dirs[2], n = 0, e;

	if (t->o.do_write)
		dirs[n++] = 1;
	if (t->o.do_read)
		dirs[n++] = 0;
	for (int i = 0; i < n; i++) {
		double left = t->t0 + t->o.budget - now_s();

		t->deadline = now_s() + (left > 0 ? left : 0) / (n - i);
		t->budget_hit = 0;
		if ((e = tune_direction(t, dirs[i])))
			return e;
		t->budget_reached |= t->budget_hit;
	}
	if (n < 2 || !t->tuned[0] || !t->tuned[1])
		return 0;
	/* how each winner does the other way, for one DeepSpeed block */
	t->deadline = 1e300;
	t->budget_hit = 0;
	for (int w = 0; w < 2; w++) {
		t->cross_gbps[w] = measure(t, &t->best[w], !w, ST_CROSS);
		if (t->cross_gbps[w] < 0)
			return EXIT_RUNTIME;
	}
	return 0;
}

/* The configuration of the single DeepSpeed "aio" block: best sum. */
static const nvio_config_t *combined_best(const struct tuner *t)
{
	if (!t->tuned[0])
		return &t->best[1];
	if (!t->tuned[1])
		return &t->best[0];
	return t->best_gbps[1] + t->cross_gbps[1] >=
	       t->best_gbps[0] + t->cross_gbps[0] ? &t->best[1] : &t->best[0];
}

/*
 * Saves the winners; 0 or the library's -errno (reported after the
 * results, which are worth having even when the file cannot be written).
 * An engine equal to what auto picked here is saved as auto: the entry
 * then keeps working where that engine cannot run (io_uring in a
 * container whose seccomp profile blocks it).
 */
static int tune_save(struct tuner *t)
{
	int any = 0;

	if (t->o.no_save)
		return 0;
	tuned_file_path(t->saved_file, sizeof(t->saved_file));
	for (int w = 0; w < 2; w++) {
		nvio_config_t c = t->best[w];
		int r;

		if (!t->tuned[w])
			continue;
		if (c.engine == t->auto_engine)
			c.engine = NVIO_ENGINE_AUTO;
		r = nvio_config_save_tuned(&c, t->o.dir, w);
		if (r)
			return r;
		any = 1;
	}
	t->saved = any;
	return 0;
}

static void save_error(const struct tuner *t, int r)
{
	msg("the results above were not saved: %s: %s (fix or remove that "
	    "file, point NVIO_TUNED_FILE elsewhere, or use --no-save)",
	    t->saved_file, nvio_strerror(r));
}

/* What auto resolves to and the engines to try; EXIT_RUNTIME (after
 * saying why) when not even a default handle can be had. */
static int list_engines(struct tuner *t)
{
	nvio_handle_t *h = handle_open(NULL, "default");
	nvio_config_t c;
	char why[256];

	if (!h)
		return EXIT_RUNTIME;
	t->auto_engine = NVIO_ENGINE_PSYNC;
	c.struct_size = sizeof(c);
	if (!nvio_handle_config(h, &c))
		t->auto_engine = c.engine;
	nvio_handle_destroy(h);
	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++)
		if (nvio_engine_available(e, why, sizeof(why)) == 1)
			t->engines[t->nengines++] = e;
	return 0;
}

static int tune_prepare(struct tuner *t)
{
	struct sample s;
	nvio_config_t c;
	nvio_handle_t *h;
	int e;

	if ((e = check_dir(t->o.dir, 1)) ||
	    (e = probe_dirs(&t->o.dir, 1, &t->probe)) ||
	    (e = check_fits(&t->o.dir, 1, &t->probe, t->o.size)) ||
	    (e = list_engines(t)))
		return e;
	t->cold = cold_choose(t->o.direct, &t->probe, 1);
	if ((e = xfer_setup(&t->x, &t->o.dir, 1, t->o.size, t->o.mem, "tune")))
		return e;
	/* lay the file out once, untimed: later writes overwrite it */
	nvio_config_init(&c);
	c.direct = t->o.direct;
	progress("%s: writing the test file", tool_prog);
	if (!(h = handle_open(&c, "write")))
		return EXIT_RUNTIME;
	e = xfer_run(h, &t->x, 1, &s) ? EXIT_RUNTIME : 0;
	nvio_handle_destroy(h);
	cleanup_check();
	return e;
}

/* ---- results ---- */

/* A direction the budget stopped before any step: its defaults only. */
static int direction_stopped(const struct tuner *t, int w)
{
	return !t->tuned[w] && t->default_gbps[w] > 0;
}

static void json_winner(struct json *j, const struct tuner *t, int w)
{
	json_obj(j, w ? "write" : "read");
	json_bool(j, "tuned", t->tuned[w]);
	if (t->tuned[w])
		json_num(j, "gbps", t->best_gbps[w]);
	else
		json_null(j, "gbps");
	json_num(j, "default_gbps", t->default_gbps[w]);
	if (t->tuned[w]) {
		config_json(j, "nvio", &t->best[w]);
		config_json_deepspeed(j, "deepspeed", &t->best[w]);
	} else {
		json_str(j, "stopped", "by --time-budget before any step "
			 "was measured");
	}
	json_close(j, '}');
}

/* The part both outputs print: the winners and one DeepSpeed block. */
static void json_winners(struct json *j, const struct tuner *t)
{
	for (int w = 1; w >= 0; w--)
		if (t->tuned[w] || direction_stopped(t, w))
			json_winner(j, t, w);
	if (t->tuned[0] || t->tuned[1])
		config_json_deepspeed(j, "deepspeed", combined_best(t));
	else
		json_null(j, "deepspeed");
}

static void json_explored(struct json *j, const struct tuner *t)
{
	json_arr(j, "explored");
	for (int i = 0; i < t->npts; i++) {
		const struct tune_point *p = &t->pts[i];

		json_obj(j, NULL);
		json_str(j, "op", p->is_write ? "write" : "read");
		json_str(j, "step", tune_step_names[p->step]);
		config_json(j, "config", &p->cfg);
		json_num(j, "gbps", p->gbps);
		json_close(j, '}');
	}
	json_close(j, ']');
}

static void tune_json(const struct tuner *t, double elapsed, int save_err)
{
	struct json j;

	json_begin(&j, stdout);
	json_str(&j, "command", "tune");
	json_str(&j, "version", nvio_version_string());
	json_str(&j, "dir", t->o.dir);
	json_uint(&j, "size", t->x.size);
	json_int(&j, "repeat", t->o.repeat);
	json_str(&j, "cold_reads", cold_name(t->cold));
	json_num(&j, "elapsed_s", elapsed);
	json_num(&j, "time_budget_s", t->o.budget);
	json_bool(&j, "budget_reached", t->budget_reached);
	json_int(&j, "transfers", t->transfers);
	json_winners(&j, t);
	if (t->saved)
		json_str(&j, "saved", t->saved_file);
	else
		json_null(&j, "saved");
	if (save_err)
		json_str(&j, "save_error", nvio_strerror(save_err));
	json_explored(&j, t);
	json_end(&j);
}

static void tune_text(const struct tuner *t, double elapsed)
{
	struct json j;
	char cfg[256], sz[32];

	printf("nvio tune: %s (%s on %s), %s per measurement, median of %d, "
	       "cold reads: %s\n", t->o.dir, t->probe.fs_type,
	       *t->probe.device ? t->probe.device : "-",
	       fmt_bytes(t->x.size, sz, sizeof(sz)), t->o.repeat,
	       cold_name(t->cold));
	for (int w = 1; w >= 0; w--) {
		if (direction_stopped(t, w))
			printf("%-5s not tuned: --time-budget ran out before any "
			       "step was measured (nvio defaults %.3f GB/s); "
			       "give it more time or a smaller --size\n",
			       w ? "write" : "read", t->default_gbps[w]);
		if (!t->tuned[w])
			continue;
		printf("%-5s best %.3f GB/s (nvio defaults %.3f GB/s, %+.0f%%): "
		       "%s\n", w ? "write" : "read", t->best_gbps[w],
		       t->default_gbps[w], 100 * (t->best_gbps[w] /
		       t->default_gbps[w] - 1), config_text(&t->best[w], cfg,
							    sizeof(cfg)));
	}
	printf("explored %d points (%d transfers) in %.1f s%s; GB = 10^9 "
	       "bytes\n", t->npts, t->transfers, elapsed, t->budget_reached ?
	       ", stopped by --time-budget" : "");
	if (t->saved)
		printf("saved as the default for %s in %s (NVIO_NO_TUNED=1 or "
		       "bench --no-tuned ignores it)\n", t->o.dir, t->saved_file);
	json_begin(&j, stdout);
	json_winners(&j, t);
	json_end(&j);
}

static void mark_winners(struct tuner *t)
{
	for (int i = 0; i < t->npts; i++) {
		struct tune_point *p = &t->pts[i];

		p->best = t->tuned[p->is_write] && p->step != ST_CROSS &&
			  same_config(&p->cfg, &t->best[p->is_write]);
	}
}

int cmd_tune(int argc, char **argv)
{
	static struct tuner t;
	struct out_file plot = { 0 };
	int e, r, save_err = 0;

	tune_parse(&t.o, argc, argv);
	progress_init(t.o.quiet);
	cleanup_install();
	/* opened first, so a plot that cannot be written stops us early */
	if (t.o.plot && (r = out_open(&plot, t.o.plot))) {
		msg("--plot %s: %s", t.o.plot, strerror(-r));
		return EXIT_RUNTIME;
	}
	t.t0 = now_s();
	e = tune_prepare(&t);
	if (!e)
		e = tune_all(&t);
	progress_done();
	xfer_teardown(&t.x);
	if (!e)
		save_err = tune_save(&t);
	mark_winners(&t);
	if (!e && plot.f) {
		r = svg_write(plot.f, t.o.dir, t.pts, t.npts);
		if (!r)
			r = out_commit(&plot);
		if (r) {
			msg("--plot %s: %s", t.o.plot, strerror(-r));
			e = EXIT_RUNTIME;
		}
	}
	out_abort(&plot);	/* nothing left to do once committed */
	cleanup_remove_all();
	if (!e && t.o.json)
		tune_json(&t, now_s() - t.t0, save_err);
	else if (!e)
		tune_text(&t, now_s() - t.t0);
	if (!e && save_err) {
		fflush(stdout);	/* the results first, then why they were not saved */
		save_error(&t, save_err);
		e = EXIT_RUNTIME;
	}
	free(t.pts);
	return e;
}

/*
 * handle.c - handle life cycle, configuration and getters.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Handle ids start at 1: a thread's record with id 0 names no handle. */
static atomic_uint_fast64_t next_handle_id = 1;

void nvio_config_init(nvio_config_t *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->struct_size = sizeof(*cfg);
	cfg->block_size = NVIO_DEFAULT_BLOCK_SIZE;
	cfg->queue_depth = NVIO_DEFAULT_QUEUE_DEPTH;
	cfg->intra_op_parallelism = 1;
	cfg->engine = NVIO_ENGINE_AUTO;
	cfg->direct = NVIO_DIRECT_AUTO;
	cfg->staging_bytes = 0;		/* automatic: see workers_alloc */
}

/*
 * The caller's configuration, whatever version of this header it was
 * built with: a smaller struct leaves our newer fields at their
 * defaults; a larger one may not set anything this library cannot honour.
 */
static int config_in(nvio_config_t *c, const nvio_config_t *theirs)
{
	size_t n = theirs->struct_size;

	nvio_config_init(c);
	if (n < offsetof(nvio_config_t, block_size))
		return -EINVAL;
	for (size_t i = sizeof(*c); i < n; i++)
		if (((const unsigned char *)theirs)[i])
			return -EINVAL;
	memcpy(c, theirs, n < sizeof(*c) ? n : sizeof(*c));
	c->struct_size = sizeof(*c);
	return 0;
}

static int check_config(const nvio_config_t *c)
{
	if (c->flags & ~NVIO_HANDLE_GDS)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(c->reserved) / sizeof(c->reserved[0]); i++)
		if (c->reserved[i])
			return -EINVAL;
	if (c->block_size == 0 || c->block_size > NVIO__MAX_BLOCK)
		return -EINVAL;
	if (c->queue_depth == 0 || c->queue_depth > NVIO_MAX_QUEUE_DEPTH)
		return -EINVAL;
	if (c->intra_op_parallelism == 0 ||
	    c->intra_op_parallelism > NVIO_MAX_PARALLELISM)
		return -EINVAL;
	if (c->single_submit > 1 || c->overlap_events > 1)
		return -EINVAL;
	if (c->engine < 0 || c->engine >= NVIO_ENGINE_COUNT_)
		return -EINVAL;
	if (!nvio_direct_name(c->direct))
		return -EINVAL;
	return 0;
}

/*
 * NVIO_ENGINE and NVIO_DIRECT supply what the configuration leaves at
 * AUTO; an explicit setting wins.
 */
static int apply_env(nvio_config_t *c, int *engine_from_env)
{
	const char *e = getenv("NVIO_ENGINE"), *d = getenv("NVIO_DIRECT");
	int v;

	*engine_from_env = 0;
	if (e && *e && c->engine == NVIO_ENGINE_AUTO) {
		v = nvio_engine_from_name(e);
		if (v < 0)
			return v;
		c->engine = v;
		*engine_from_env = 1;
	}
	if (d && *d && c->direct == NVIO_DIRECT_AUTO) {
		v = nvio_direct_from_name(d);
		if (v < 0)
			return v;
		c->direct = v;
	}
	return 0;
}

static void engines_fini(struct nvio_handle *h, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		h->workers[i].eng->fini(h->workers[i].ectx);
		h->workers[i].ectx = NULL;
	}
}

/* Gives every worker a context of engine `id`; all or none. */
static int engines_init(struct nvio_handle *h, int id)
{
	const struct nvio__engine_ops *eng = nvio__engine(id);

	for (unsigned i = 0; i < h->nworkers; i++) {
		int r;

		h->workers[i].eng = h->workers[i].base = eng;
		r = eng->init(&h->workers[i].ectx, h->cfg.queue_depth);
		if (r < 0) {
			engines_fini(h, i);
			return r;
		}
	}
	return 0;
}

static int choose_engine(struct nvio_handle *h, int from_env)
{
	static const int order[] = { NVIO_ENGINE_URING, NVIO_ENGINE_AIO,
				     NVIO_ENGINE_PSYNC };
	char note[256] = "";
	size_t used = 0;
	int r;

	if (h->cfg.engine != NVIO_ENGINE_AUTO) {
		r = engines_init(h, h->cfg.engine);
		if (r == 0)
			snprintf(h->engine_note, sizeof(h->engine_note),
				 "%s: %s", nvio_engine_name(h->cfg.engine),
				 from_env ? "set by NVIO_ENGINE" : "requested");
		return r;
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		r = engines_init(h, order[i]);
		if (r == 0) {
			h->cfg.engine = order[i];
			snprintf(h->engine_note, sizeof(h->engine_note),
				 "%s: auto%s%s", nvio_engine_name(order[i]),
				 used ? ", after " : " (first choice)", note);
			return 0;
		}
		used += (size_t)snprintf(note + used, sizeof(note) - used,
					 "%s%s refused: %s", used ? "; " : "",
					 nvio_engine_name(order[i]), nvio_strerror(r));
		if (used >= sizeof(note))
			used = sizeof(note) - 1;
	}
	return r;
}

/* A GDS handle says whether CUDA buffers will really use cuFile. */
static void gds_note(struct nvio_handle *h)
{
	char why[160];
	size_t n = strlen(h->engine_note);
	int mode = nvio_gds_mode(why, sizeof(why));

	h->gds = mode != NVIO_CUFILE_NONE;
	snprintf(h->engine_note + n, sizeof(h->engine_note) - n,
		 "; GPU buffers: %s (%s)",
		 mode == NVIO_CUFILE_DIRECT ? "cuFile, GPUDirect" :
		 mode == NVIO_CUFILE_COMPAT ? "cuFile, compatibility mode" :
		 "bounce buffers", why);
}

/*
 * A GDS handle whose cuFile is usable puts the cuFile engine over each
 * worker's engine, before the workers start.
 */
static int gds_engines(struct nvio_handle *h)
{
	gds_note(h);
	for (unsigned i = 0; h->gds && i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];
		void *c;
		int r = nvio__cufile_engine_wrap(&c, h->cfg.queue_depth, w->base, w->ectx);

		if (r < 0)
			return r;
		w->ectx = c;
		w->eng = &nvio__engine_cufile;
	}
	return 0;
}

static void handle_free(struct nvio_handle *h)
{
	for (unsigned i = 0; i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];

		if (w->ectx)
			w->eng->fini(w->ectx);
		nvio__stage_fini(&w->stage);
		pthread_mutex_destroy(&w->lock);
		pthread_cond_destroy(&w->cond);
	}
	nvio__track_fini(h);
	free(h->workers);
	free(h);
}

/*
 * Bounce buffers per worker. All but one (sliding) or half (batches) of
 * the pool is in flight while the worker copies through the rest
 * (workers.c), so by default it holds a block for every slot: a full
 * queue, or two batches of one, at most 128 MiB: a device is kept busy
 * by what is in flight, and a small pool starves it (measured in
 * bench/results/measured-constants.md). Buffers are made on first use,
 * so aligned transfers never pay for the pool.
 */
static int workers_alloc(struct nvio_handle *h)
{
	uint64_t chunk = (h->cfg.block_size + NVIO__PAGE - 1) / NVIO__PAGE * NVIO__PAGE;
	uint64_t slots = nvio__worker_slots(&h->cfg), count;

	if (h->cfg.staging_bytes == 0) {
		uint64_t want = chunk * slots;

		h->cfg.staging_bytes = want < NVIO_MAX_AUTO_STAGING_BYTES ?
				       want : NVIO_MAX_AUTO_STAGING_BYTES;
	}
	count = h->cfg.staging_bytes / chunk;

	/* Two buffers at least, so copying one overlaps the other's I/O
	 * (above the cap with blocks over 64 MiB); never more than there
	 * are slots to use them. The size in force is what is reported. */
	if (count > slots)
		count = slots;
	if (count < 2)
		count = 2;
	h->cfg.staging_bytes = count * chunk;
	h->workers = calloc(h->nworkers, sizeof(*h->workers));
	if (!h->workers) {
		h->nworkers = 0;
		return -ENOMEM;
	}
	for (unsigned i = 0; i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];

		w->h = h;
		w->id = i;
		pthread_mutex_init(&w->lock, NULL);
		pthread_cond_init(&w->cond, NULL);
		if (nvio__stage_init(&w->stage, (unsigned)count, (size_t)chunk) < 0)
			return -ENOMEM;
	}
	return 0;
}

int nvio_handle_create(nvio_handle_t **out, const nvio_config_t *cfg)
{
	struct nvio_handle *h;
	int from_env, r;

	if (!out)
		return -EINVAL;
	*out = NULL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	nvio_config_init(&h->cfg);
	r = cfg ? config_in(&h->cfg, cfg) : 0;
	if (!r)
		r = check_config(&h->cfg);
	if (!r)
		r = apply_env(&h->cfg, &from_env);
	if (r) {
		free(h);
		return r;
	}
	h->fork_gen = nvio__fork_watch();
	nvio__track_init(h);
	h->id = atomic_fetch_add(&next_handle_id, 1);
	h->nworkers = h->cfg.intra_op_parallelism;
	r = workers_alloc(h);
	if (!r)
		r = choose_engine(h, from_env);
	if (!r && (h->cfg.flags & NVIO_HANDLE_GDS))
		r = gds_engines(h);
	if (!r)
		r = nvio__workers_start(h);
	if (r) {
		nvio__workers_stop(h);
		handle_free(h);
		return r;
	}
	*out = h;
	return 0;
}

void nvio_handle_destroy(nvio_handle_t *h)
{
	if (!h || nvio__forked(h))
		return;	/* the parent's: its threads are not here to join */
	/* every async op, of any sink, ends before the workers stop (a
	 * thread still submitting is the caller's error) */
	nvio__track_quiesce(h, NULL);
	nvio__workers_stop(h);
	handle_free(h);
}

int nvio_handle_config(const nvio_handle_t *h, nvio_config_t *out)
{
	if (!h || !out)
		return -EINVAL;
	/* the caller's struct_size says how much of it there is */
	return nvio__struct_out(out, &h->cfg, sizeof(h->cfg));
}

uint64_t nvio_get_block_size(const nvio_handle_t *h)
{
	return h ? h->cfg.block_size : 0;
}

uint32_t nvio_get_queue_depth(const nvio_handle_t *h)
{
	return h ? h->cfg.queue_depth : 0;
}

int nvio_get_single_submit(const nvio_handle_t *h)
{
	return h ? (int)h->cfg.single_submit : -EINVAL;
}

int nvio_get_overlap_events(const nvio_handle_t *h)
{
	return h ? (int)h->cfg.overlap_events : -EINVAL;
}

uint32_t nvio_get_intra_op_parallelism(const nvio_handle_t *h)
{
	return h ? h->cfg.intra_op_parallelism : 0;
}

int nvio_get_engine(const nvio_handle_t *h)
{
	return h ? h->cfg.engine : -EINVAL;
}

int nvio_get_gds(const nvio_handle_t *h)
{
	return h ? h->gds : -EINVAL;
}

int nvio_get_direct(const nvio_handle_t *h)
{
	return h ? h->cfg.direct : -EINVAL;
}

const char *nvio_get_engine_note(const nvio_handle_t *h)
{
	return h ? h->engine_note : "";
}

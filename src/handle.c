/*
 * handle.c - handle life cycle, configuration, getters, wait and errors.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/*
 * The last failure returned to this thread, and the handle it came from.
 * Threads sharing a handle each keep their own, so one thread's error
 * never describes another's failure; a handle id is never reused, so a
 * record cannot outlive its handle into a new one at the same address.
 */
static _Thread_local struct {
	uint64_t handle_id;
	nvio_error_t e;
} thread_last;

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

static int check_config(const nvio_config_t *c)
{
	if (c->struct_size < sizeof(*c) || (c->flags & ~NVIO_HANDLE_GDS))
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

/* NVIO_ENGINE and NVIO_DIRECT override the configuration. */
static int apply_env(nvio_config_t *c, int *engine_from_env)
{
	const char *e = getenv("NVIO_ENGINE"), *d = getenv("NVIO_DIRECT");
	int v;

	*engine_from_env = 0;
	if (e && *e) {
		v = nvio_engine_from_name(e);
		if (v < 0)
			return v;
		c->engine = v;
		*engine_from_env = 1;
	}
	if (d && *d) {
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

		h->workers[i].eng = eng;
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
	pthread_mutex_destroy(&h->lock);
	pthread_mutex_destroy(&h->wait_lock);
	pthread_cond_destroy(&h->cond);
	free(h->workers);
	free(h);
}

/*
 * Bounce buffers per worker. All but one (sliding) or half (batches) of
 * the pool is in flight while the worker copies through the rest
 * (workers.c), so by default it holds a block for every slot: a full
 * queue, or two batches of one, at most 128 MiB. On our virtio disk a
 * write needs about 64 MiB in flight to run at full speed; a fixed
 * 16 MiB pool cut misaligned-buffer writes to a third, and batches of
 * half a queue cost 14% at queue depth 32. Buffers are made on first
 * use, so aligned transfers never pay for the pool.
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
	if (cfg) {
		if (cfg->struct_size < sizeof(*cfg)) {
			free(h);
			return -EINVAL;
		}
		h->cfg = *cfg;
	} else {
		nvio_config_init(&h->cfg);
	}
	r = check_config(&h->cfg);
	if (!r)
		r = apply_env(&h->cfg, &from_env);
	if (r) {
		free(h);
		return r;
	}
	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->wait_lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	h->id = atomic_fetch_add(&next_handle_id, 1);
	h->nworkers = h->cfg.intra_op_parallelism;
	r = workers_alloc(h);
	if (!r)
		r = choose_engine(h, from_env);
	if (!r)
		r = nvio__workers_start(h);
	if (!r && (h->cfg.flags & NVIO_HANDLE_GDS))
		gds_note(h);
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
	if (!h)
		return;
	/* every async op, whatever its generation, ends before the workers
	 * stop (a thread still submitting is the caller's error) */
	pthread_mutex_lock(&h->lock);
	while (h->gens[0].inflight > 0 || h->gens[1].inflight > 0)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
	nvio__workers_stop(h);
	handle_free(h);
}

int nvio_handle_config(const nvio_handle_t *h, nvio_config_t *out)
{
	if (!h || !out)
		return -EINVAL;
	*out = h->cfg;
	return 0;
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

int nvio_wait(nvio_handle_t *h)
{
	struct nvio__gen *g;
	nvio_error_t e;
	int r;

	if (!h)
		return -EINVAL;
	/* Waits take turns: when this one flips the generation, the other
	 * one holds nothing (the previous wait reported it all). */
	pthread_mutex_lock(&h->wait_lock);
	pthread_mutex_lock(&h->lock);
	g = &h->gens[h->gen & 1];
	h->gen++;	/* ops submitted from now on are the next wait's */
	while (g->inflight > 0)
		pthread_cond_wait(&h->cond, &h->lock);
	r = g->err ? g->err : g->done > INT_MAX ? INT_MAX : (int)g->done;
	if (g->err)
		e = g->rec;
	g->err = 0;
	g->done = 0;
	pthread_mutex_unlock(&h->lock);
	pthread_mutex_unlock(&h->wait_lock);
	/* The record of the op whose error this wait returns. */
	return r < 0 ? nvio__error_publish(h, &e) : r;
}

uint32_t nvio_pending(const nvio_handle_t *h)
{
	uint32_t n;

	if (!h)
		return 0;
	pthread_mutex_lock((pthread_mutex_t *)&h->lock);
	n = h->gens[0].inflight + h->gens[0].done + h->gens[1].inflight +
	    h->gens[1].done;
	pthread_mutex_unlock((pthread_mutex_t *)&h->lock);
	return n;
}

void nvio__error_fill(nvio_error_t *e, int err, const struct nvio__op *op,
		      const char *what, uint64_t off, uint64_t len)
{
	memset(e, 0, sizeof(*e));
	e->err = err;
	e->offset = (int64_t)off;
	e->nbytes = len;
	snprintf(e->what, sizeof(e->what), "%s", what);
	if (op) {
		e->is_write = op->is_write;
		e->op_seq = op->seq;
		snprintf(e->path, sizeof(e->path), "%s", op->path ? op->path : "");
	}
}

int nvio__error_publish(struct nvio_handle *h, const nvio_error_t *e)
{
	thread_last.e = *e;
	thread_last.handle_id = h->id;
	pthread_mutex_lock(&h->lock);
	h->last = *e;
	pthread_mutex_unlock(&h->lock);
	return e->err;
}

int nvio_last_error(const nvio_handle_t *h, nvio_error_t *out)
{
	if (!h || !out)
		return -EINVAL;
	if (thread_last.handle_id == h->id) {
		*out = thread_last.e;
		return out->err;
	}
	pthread_mutex_lock((pthread_mutex_t *)&h->lock);
	*out = h->last;
	pthread_mutex_unlock((pthread_mutex_t *)&h->lock);
	return out->err;
}

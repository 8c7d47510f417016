/*
 * track.c - where ended ops are reported: completions, waits, errors.
 *
 * Every accepted op is registered here before its first piece runs
 * (nvio__track_begin) and reported here exactly once when it ends
 * (nvio__track_end), to one of three sinks:
 *   - its submitter, for a sync op (op->done, then the submitter frees it);
 *   - a group: the generation of nvio_wait it was submitted in (the
 *     one-buffer calls with NVIO_ASYNC), or a stream's flushes;
 *   - the handle's completion queue, for tagged ops (nvio_submit): one
 *     nvio_completion_t each, reaped with nvio_reap, signalled on the
 *     eventfd of nvio_completion_fd.
 * This file owns the handle's lock and condition, and the error records
 * behind nvio_last_error.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

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

void nvio__track_init(struct nvio_handle *h)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->wait_lock, NULL);
	/* reap timeouts are measured on the monotonic clock */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cond, &ca);
	pthread_condattr_destroy(&ca);
	h->efd = -1;
}

void nvio__track_fini(struct nvio_handle *h)
{
	pthread_mutex_destroy(&h->lock);
	pthread_mutex_destroy(&h->wait_lock);
	pthread_cond_destroy(&h->cond);
	if (h->efd >= 0)
		nvio__sys.close(h->efd);
	free(h->cq);
}

void nvio__track_begin(struct nvio__op *op)
{
	struct nvio_handle *h = op->h;

	pthread_mutex_lock(&h->lock);
	if (op->sink == NVIO__SINK_GROUP && !op->group)
		op->group = &h->gens[h->gen & 1];	/* nvio_wait's */
	if (op->sink == NVIO__SINK_GROUP)
		op->group->inflight++;
	else if (op->sink == NVIO__SINK_QUEUE)
		h->tagged++;
	op->file->inflight++;
	pthread_mutex_unlock(&h->lock);
}

/* Room for one more completion in the ring (h->lock held). */
static int cq_reserve(struct nvio_handle *h)
{
	nvio_completion_t *n;
	unsigned cap;

	if (h->cq_count < h->cq_cap)
		return 0;
	cap = h->cq_cap ? h->cq_cap * 2 : 64;
	n = malloc(cap * sizeof(*n));
	if (!n)
		return -ENOMEM;
	for (unsigned i = 0; i < h->cq_count; i++)
		n[i] = h->cq[(h->cq_head + i) % h->cq_cap];
	free(h->cq);
	h->cq = n;
	h->cq_cap = cap;
	h->cq_head = 0;
	return 0;
}

static void completion_of(const struct nvio__op *op, nvio_completion_t *c)
{
	int err = atomic_load(&op->err);

	memset(c, 0, sizeof(*c));
	c->user_data = op->user_data;
	c->res = err ? err : (int64_t)op->nbytes;
	c->op_seq = op->seq;
	c->flags = op->is_write ? NVIO_COMPLETION_WRITE : 0;
	if (err) {
		c->err_offset = (int64_t)op->fail_off;
		c->err_nbytes = op->fail_len;
		snprintf(c->err_what, sizeof(c->err_what), "%s",
			 op->fail_what ? op->fail_what : "");
	}
}

/* The eventfd is readable exactly while completions wait (h->lock held). */
static void efd_signal(struct nvio_handle *h)
{
	uint64_t one = 1;

	if (h->efd >= 0 && h->cq_count == 1 &&
	    write(h->efd, &one, sizeof(one)) < 0) {
		/* full counter (cannot happen: it holds 0 or 1) */
	}
}

static void efd_drain(struct nvio_handle *h)
{
	uint64_t v;

	if (h->efd >= 0 && h->cq_count == 0 && read(h->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: it was not set */
	}
}

/*
 * Reports an ended op. A completion that finds no memory for the queue
 * is not dropped: the op waits here until there is room (the ring only
 * grows while completions are not reaped, so room comes back). Returns
 * 1 if the caller must free the op now (nobody waits for it).
 */
int nvio__track_end(struct nvio__op *op)
{
	struct nvio_handle *h = op->h;
	int err = atomic_load(&op->err);
	/* Read before unlocking: a woken sync submitter frees the op. */
	int sink = op->sink;

	pthread_mutex_lock(&h->lock);
	op->file->inflight--;
	if (sink == NVIO__SINK_GROUP) {
		struct nvio__group *g = op->group;

		g->inflight--;
		g->done++;
		if (err && !g->err) {
			g->err = err;
			nvio__error_fill(&g->rec, err, op, op->fail_what,
					 op->fail_off, op->fail_len);
		}
	} else if (sink == NVIO__SINK_QUEUE) {
		while (cq_reserve(h) < 0)
			pthread_cond_wait(&h->cond, &h->lock);
		completion_of(op, &h->cq[(h->cq_head + h->cq_count) % h->cq_cap]);
		h->cq_count++;
		h->tagged--;
		efd_signal(h);
	} else {
		op->done = 1;
	}
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	return sink != NVIO__SINK_SYNC;
}

void nvio__track_wait_sync(struct nvio__op *op)
{
	struct nvio_handle *h = op->h;

	pthread_mutex_lock(&h->lock);
	while (!op->done)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

void nvio__group_wait(struct nvio_handle *h, struct nvio__group *g)
{
	pthread_mutex_lock(&h->lock);
	while (g->inflight > 0)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

void nvio__track_quiesce(struct nvio_handle *h, const struct nvio_file *f)
{
	pthread_mutex_lock(&h->lock);
	if (f) {
		while (f->inflight > 0)
			pthread_cond_wait(&h->cond, &h->lock);
	} else {
		while (h->gens[0].inflight > 0 || h->gens[1].inflight > 0 ||
		       h->tagged > 0)
			pthread_cond_wait(&h->cond, &h->lock);
	}
	pthread_mutex_unlock(&h->lock);
}

int nvio_wait(nvio_handle_t *h)
{
	struct nvio__group *g;
	nvio_error_t e;
	int r;

	if (!h)
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
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

uint32_t nvio_inflight(const nvio_handle_t *h)
{
	uint32_t n;

	if (!h)
		return 0;
	pthread_mutex_lock((pthread_mutex_t *)&h->lock);
	n = h->tagged + h->cq_count;
	pthread_mutex_unlock((pthread_mutex_t *)&h->lock);
	return n;
}

/* The absolute monotonic time timeout_ns from now. */
static struct timespec deadline_in(int64_t timeout_ns)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(timeout_ns / 1000000000);
	ts.tv_nsec += (long)(timeout_ns % 1000000000);
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

int nvio_wait_idle(nvio_handle_t *h, int64_t timeout_ns)
{
	struct timespec until;
	int r = 0;

	if (!h)
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
	if (timeout_ns > 0)
		until = deadline_in(timeout_ns);
	pthread_mutex_lock(&h->lock);
	while (h->gens[0].inflight > 0 || h->gens[1].inflight > 0) {
		if (timeout_ns == 0) {
			r = -ETIMEDOUT;
			break;
		}
		if (timeout_ns < 0)
			pthread_cond_wait(&h->cond, &h->lock);
		else if (pthread_cond_timedwait(&h->cond, &h->lock, &until) == ETIMEDOUT) {
			r = h->gens[0].inflight > 0 || h->gens[1].inflight > 0 ? -ETIMEDOUT : 0;
			break;
		}
	}
	pthread_mutex_unlock(&h->lock);
	return r;
}

int nvio_reap(nvio_handle_t *h, nvio_completion_t *out, unsigned max,
	      unsigned min, int64_t timeout_ns)
{
	struct timespec until;
	unsigned n = 0;

	if (!h || min > max || (max > 0 && !out))
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
	if (timeout_ns > 0)
		until = deadline_in(timeout_ns);
	pthread_mutex_lock(&h->lock);
	while (h->cq_count < min && timeout_ns != 0) {
		if (timeout_ns < 0)
			pthread_cond_wait(&h->cond, &h->lock);
		else if (pthread_cond_timedwait(&h->cond, &h->lock, &until) == ETIMEDOUT)
			break;
	}
	while (n < max && h->cq_count > 0) {
		out[n++] = h->cq[h->cq_head];
		h->cq_head = (h->cq_head + 1) % h->cq_cap;
		h->cq_count--;
	}
	efd_drain(h);
	if (n)
		pthread_cond_broadcast(&h->cond);	/* room in the ring */
	pthread_mutex_unlock(&h->lock);
	return (int)n;
}

int nvio_completion_fd(nvio_handle_t *h)
{
	int fd;

	if (!h)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (h->efd < 0) {
		fd = nvio__sys.eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			pthread_mutex_unlock(&h->lock);
			return fd;
		}
		h->efd = fd;
		if (h->cq_count > 0) {
			uint64_t one = 1;

			if (write(fd, &one, sizeof(one)) < 0) {
				/* a fresh eventfd takes it */
			}
		}
	}
	fd = h->efd;
	pthread_mutex_unlock(&h->lock);
	return fd;
}

int nvio_completion_error(const nvio_completion_t *c, const char *path,
			  nvio_error_t *out)
{
	nvio_error_t e;

	if (!c || !out)
		return -EINVAL;
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	e.err = c->res < 0 ? (int32_t)c->res : 0;
	e.is_write = (c->flags & NVIO_COMPLETION_WRITE) != 0;
	e.op_seq = c->op_seq;
	e.offset = c->err_offset;
	e.nbytes = c->err_nbytes;
	e.user_data = c->user_data;
	snprintf(e.what, sizeof(e.what), "%s", c->err_what);
	snprintf(e.path, sizeof(e.path), "%s", path ? path : "");
	if (nvio__struct_out(out, &e, sizeof(e)) < 0)
		return -EINVAL;
	return e.err;
}

/* ---- error records -------------------------------------------------- */

int nvio__struct_out(void *dst, const void *src, size_t ours)
{
	uint32_t theirs;

	memcpy(&theirs, dst, sizeof(theirs));
	if (theirs < 8)
		return -EINVAL;
	/* the caller's struct_size stays what the caller said */
	memcpy((char *)dst + 4, (const char *)src + 4,
	       (theirs < ours ? theirs : ours) - 4);
	return 0;
}

void nvio__error_fill(nvio_error_t *e, int err, const struct nvio__op *op,
		      const char *what, uint64_t off, uint64_t len)
{
	memset(e, 0, sizeof(*e));
	e->struct_size = sizeof(*e);
	e->err = err;
	e->offset = (int64_t)off;
	e->nbytes = len;
	snprintf(e->what, sizeof(e->what), "%s", what ? what : "");
	if (op) {
		e->is_write = op->is_write;
		e->op_seq = op->seq;
		e->user_data = op->user_data;
		snprintf(e->path, sizeof(e->path), "%s", op->file->path);
	}
}

int nvio__error_publish(struct nvio_handle *h, const nvio_error_t *e)
{
	thread_last.e = *e;
	thread_last.handle_id = h->id;
	if (nvio__forked(h))
		return e->err;	/* its lock may have been held at the fork */
	pthread_mutex_lock(&h->lock);
	h->last = *e;
	pthread_mutex_unlock(&h->lock);
	return e->err;
}

/* 0.2 layout of nvio_error_t; the 0.1 one is in compat.c. */
#ifdef NVIO_SYMVER
__asm__(".symver nvio_last_error, nvio_last_error@@@NVIO_0.2");
#endif

int nvio_last_error(const nvio_handle_t *h, nvio_error_t *out)
{
	nvio_error_t e;

	if (!h || !out)
		return -EINVAL;
	if (thread_last.handle_id == h->id) {
		e = thread_last.e;
	} else if (nvio__forked(h)) {
		memset(&e, 0, sizeof(e));	/* its lock may be held: no look */
	} else {
		pthread_mutex_lock((pthread_mutex_t *)&h->lock);
		e = h->last;
		pthread_mutex_unlock((pthread_mutex_t *)&h->lock);
	}
	e.struct_size = sizeof(e);
	if (nvio__struct_out(out, &e, sizeof(e)) < 0)
		return -EINVAL;
	return e.err;
}

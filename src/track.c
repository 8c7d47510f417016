/*
 * track.c - where ended ops are reported: completions, waits, errors.
 *
 * Every accepted op is registered here before its first piece runs
 * (nvio__track_begin) and reported here exactly once when it ends
 * (nvio__track_end), to one of three sinks:
 *   - its submitter, for a sync op (op->done, then the submitter frees it);
 *   - a group: the generation of nvio_wait it was submitted in (the
 *     one-buffer calls with NVIO_ASYNC), or a stream's flushes;
 *   - a completion queue, for tagged ops (nvio_queue_submit; nvio_submit
 *     is the handle's default queue): one nvio_completion_t each, reaped
 *     with nvio_queue_reap by the queue's one consumer, signalled on the
 *     queue's eventfd. Each queue lists its ops in flight, for
 *     nvio_queue_cancel.
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

/* Timeouts are measured on the monotonic clock. */
static void cond_init(pthread_cond_t *c)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
}

int nvio__queue_init(struct nvio_handle *h, struct nvio_queue *q)
{
	memset(q, 0, sizeof(*q));
	q->h = h;
	q->efd = -1;
	cond_init(&q->cond);
	return 0;
}

static void queue_fini(struct nvio_queue *q)
{
	pthread_cond_destroy(&q->cond);
	if (q->efd >= 0)
		nvio__sys.close(q->efd);
	free(q->cq);
}

void nvio__track_init(struct nvio_handle *h)
{
	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->wait_lock, NULL);
	cond_init(&h->cond);
	nvio__queue_init(h, &h->q0);
}

/* The queues a handle is destroyed with (its ops have all ended). */
void nvio__queues_fini(struct nvio_handle *h)
{
	while (h->queues) {
		struct nvio_queue *q = h->queues;

		h->queues = q->next;
		queue_fini(q);
		free(q);
	}
}

void nvio__track_fini(struct nvio_handle *h)
{
	nvio__queues_fini(h);
	queue_fini(&h->q0);
	pthread_mutex_destroy(&h->lock);
	pthread_mutex_destroy(&h->wait_lock);
	pthread_cond_destroy(&h->cond);
}

static void queue_add(struct nvio_queue *q, struct nvio__op *op)
{
	q->tagged++;
	q->h->tagged++;
	op->qprev = NULL;
	op->qnext = q->ops;
	if (q->ops)
		q->ops->qprev = op;
	q->ops = op;
}

static void queue_remove(struct nvio_queue *q, struct nvio__op *op)
{
	if (op->qprev)
		op->qprev->qnext = op->qnext;
	else
		q->ops = op->qnext;
	if (op->qnext)
		op->qnext->qprev = op->qprev;
	q->tagged--;
	q->h->tagged--;
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
		queue_add(op->queue, op);
	op->file->inflight++;
	pthread_mutex_unlock(&h->lock);
}

/* Room for one more completion in the ring (h->lock held). */
static int cq_reserve(struct nvio_queue *q)
{
	nvio_completion_t *n;
	unsigned cap;

	if (q->cq_count < q->cq_cap)
		return 0;
	cap = q->cq_cap ? q->cq_cap * 2 : 64;
	n = malloc(cap * sizeof(*n));
	if (!n)
		return -ENOMEM;
	for (unsigned i = 0; i < q->cq_count; i++)
		n[i] = q->cq[(q->cq_head + i) % q->cq_cap];
	free(q->cq);
	q->cq = n;
	q->cq_cap = cap;
	q->cq_head = 0;
	return 0;
}

static void completion_of(const struct nvio__op *op, nvio_completion_t *c)
{
	int err = atomic_load(&op->err);

	memset(c, 0, sizeof(*c));
	c->struct_size = sizeof(*c);
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
static void efd_signal(struct nvio_queue *q)
{
	uint64_t one = 1;

	if (q->efd >= 0 && q->cq_count == 1 &&
	    write(q->efd, &one, sizeof(one)) < 0) {
		/* full counter (cannot happen: it holds 0 or 1) */
	}
}

static void efd_drain(struct nvio_queue *q)
{
	uint64_t v;

	if (q->efd >= 0 && q->cq_count == 0 && read(q->efd, &v, sizeof(v)) < 0) {
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
		struct nvio_queue *q = op->queue;

		while (cq_reserve(q) < 0)
			pthread_cond_wait(&h->cond, &h->lock);
		completion_of(op, &q->cq[(q->cq_head + q->cq_count) % q->cq_cap]);
		q->cq_count++;
		queue_remove(q, op);
		efd_signal(q);
		pthread_cond_broadcast(&q->cond);
	} else {
		op->done = 1;
	}
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	return sink != NVIO__SINK_SYNC;
}

void nvio__track_ending(struct nvio__op *op)
{
	pthread_mutex_lock(&op->h->lock);
	op->ending = 1;
	pthread_mutex_unlock(&op->h->lock);
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
	n = h->q0.tagged + h->q0.cq_count;
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

/* 0.3 layout of nvio_completion_t; 0.2's is in abi_old.c. */
#ifdef NVIO_SYMVER
__asm__(".symver nvio_reap, nvio_reap@@@NVIO_0.3");
__asm__(".symver nvio_completion_error, nvio_completion_error@@@NVIO_0.3");
#endif

int nvio_queue_reap(nvio_queue_t *q, nvio_completion_t *out, unsigned max,
		    unsigned min, int64_t timeout_ns)
{
	struct nvio_handle *h = q ? q->h : NULL;
	struct timespec until;
	unsigned n = 0;

	if (!q || min > max || (max > 0 && !out))
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
	if (timeout_ns > 0)
		until = deadline_in(timeout_ns);
	pthread_mutex_lock(&h->lock);
	while (q->cq_count < min && timeout_ns != 0) {
		if (timeout_ns < 0)
			pthread_cond_wait(&q->cond, &h->lock);
		else if (pthread_cond_timedwait(&q->cond, &h->lock, &until) == ETIMEDOUT)
			break;
	}
	while (n < max && q->cq_count > 0) {
		out[n++] = q->cq[q->cq_head];
		q->cq_head = (q->cq_head + 1) % q->cq_cap;
		q->cq_count--;
	}
	efd_drain(q);
	if (n)
		pthread_cond_broadcast(&h->cond);	/* room in the ring */
	pthread_mutex_unlock(&h->lock);
	return (int)n;
}

int nvio_reap(nvio_handle_t *h, nvio_completion_t *out, unsigned max,
	      unsigned min, int64_t timeout_ns)
{
	return h ? nvio_queue_reap(&h->q0, out, max, min, timeout_ns) : -EINVAL;
}

int nvio_queue_fd(nvio_queue_t *q)
{
	struct nvio_handle *h = q ? q->h : NULL;
	uint64_t one = 1;
	int fd;

	if (!q)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (q->efd < 0) {
		fd = nvio__sys.eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			pthread_mutex_unlock(&h->lock);
			return fd;
		}
		q->efd = fd;
		if (q->cq_count > 0 && write(fd, &one, sizeof(one)) < 0) {
			/* a fresh eventfd takes it */
		}
	}
	fd = q->efd;
	pthread_mutex_unlock(&h->lock);
	return fd;
}

int nvio_completion_fd(nvio_handle_t *h)
{
	return h ? nvio_queue_fd(&h->q0) : -EINVAL;
}

uint32_t nvio_queue_inflight(const nvio_queue_t *q)
{
	uint32_t n;

	if (!q)
		return 0;
	pthread_mutex_lock(&q->h->lock);
	n = q->tagged + q->cq_count;
	pthread_mutex_unlock(&q->h->lock);
	return n;
}

nvio_queue_t *nvio_handle_queue(nvio_handle_t *h)
{
	return h ? &h->q0 : NULL;
}

int nvio_queue_create(nvio_handle_t *h, nvio_queue_t **out, unsigned flags)
{
	struct nvio_queue *q;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!h || flags)
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
	if (!(q = malloc(sizeof(*q))))
		return -ENOMEM;
	nvio__queue_init(h, q);
	pthread_mutex_lock(&h->lock);
	q->next = h->queues;
	h->queues = q;
	pthread_mutex_unlock(&h->lock);
	*out = q;
	return 0;
}

int nvio_queue_destroy(nvio_queue_t *q)
{
	struct nvio_handle *h = q ? q->h : NULL;
	struct nvio_queue **p;

	if (!q || q == &h->q0)
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;	/* the parent's: nothing of it is freed here */
	pthread_mutex_lock(&h->lock);
	while (q->tagged > 0)
		pthread_cond_wait(&h->cond, &h->lock);
	for (p = &h->queues; *p && *p != q; p = &(*p)->next)
		;
	if (*p)
		*p = q->next;
	pthread_mutex_unlock(&h->lock);
	queue_fini(q);
	free(q);
	return 0;
}

int nvio_queue_cancel(nvio_queue_t *q, uint64_t user_data)
{
	struct nvio_handle *h = q ? q->h : NULL;
	int n = 0, late = 0;

	if (!q)
		return -EINVAL;
	if (nvio__forked(h))
		return -ECHILD;
	pthread_mutex_lock(&h->lock);
	for (struct nvio__op *op = q->ops; op; op = op->qnext) {
		if (op->user_data != user_data)
			continue;
		if (op->ending) {
			late++;
			continue;
		}
		/* the workers skip the pieces they have not issued (workers.c) */
		nvio__op_fail(op, -ECANCELED, "cancel", op->ext[0].plan.off, op->nbytes);
		n++;
	}
	pthread_mutex_unlock(&h->lock);
	return n ? n : late ? -EALREADY : -ENOENT;
}

int nvio_cancel(nvio_handle_t *h, uint64_t user_data)
{
	return h ? nvio_queue_cancel(&h->q0, user_data) : -EINVAL;
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

/* 0.2 layout of nvio_error_t; the 0.1 one is in abi_old.c. */
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

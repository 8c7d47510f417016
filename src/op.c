/*
 * op.c - how an accepted op ends.
 *
 * When the last task of an op is done, the thread that finished it
 * (a worker, or the submitter for an op with no pieces) runs the op's
 * epilogue: validation, fsync, the rename of a whole-file write, closing
 * the descriptors; then it reports the op to the handle exactly once.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

void nvio__op_fail(struct nvio__op *op, int err, const char *what,
		   uint64_t off, uint64_t len)
{
	int expected = 0;

	/* The first error is the op's; later ones are its consequences. */
	if (atomic_compare_exchange_strong(&op->err, &expected, err)) {
		op->fail_what = what;
		op->fail_off = off;
		op->fail_len = len;
	}
}

void nvio__op_record(const struct nvio__op *op, nvio_error_t *e)
{
	nvio__error_fill(e, atomic_load(&op->err), op, op->fail_what,
			 op->fail_off, op->fail_len);
}

/*
 * Re-reads the op's range through the page cache (direct writes have
 * invalidated it, so this reads what the device holds) and compares.
 */
static int validate(struct nvio__op *op)
{
	size_t blk = 1u << 20;
	unsigned char *tmp, *cmp = NULL;
	struct nvio__cuda_ctx cuda = { 0 };
	uint64_t done = 0;
	int fd, r = 0;

	/* the file the op moved, whatever its name is now */
	fd = nvio__reopen(op->fd, op->tmp_path ? op->tmp_path :
			  op->by_path ? op->path : NULL, O_RDONLY, NULL);
	if (fd < 0) {
		nvio__op_fail(op, fd, "validate open", op->plan.off, op->plan.len);
		return fd;
	}
	tmp = malloc(blk);
	if (op->mem != NVIO__MEM_HOST)
		cmp = malloc(blk);
	if (!tmp || (op->mem != NVIO__MEM_HOST && !cmp))
		r = -ENOMEM;
	while (!r && done < op->plan.len) {
		size_t n = op->plan.len - done < blk ? op->plan.len - done : blk;
		const unsigned char *mine = op->buf + done;

		r = nvio__pread_full(fd, tmp, n, op->plan.off + done);
		if (!r && cmp && !cuda.stream)
			r = nvio__cuda_ctx_open(&cuda, op->cuda_device);
		if (!r && cmp) {
			r = nvio__cuda_copy(cmp, mine, n, 0, &cuda);
			mine = cmp;
		}
		if (!r && memcmp(tmp, mine, n))
			r = -EBADMSG;
		if (r)
			nvio__op_fail(op, r, "validate", op->plan.off + done, n);
		done += n;
	}
	nvio__cuda_ctx_close(&cuda);
	free(tmp);
	free(cmp);
	nvio__sys.close(fd);
	return r;
}

static int fsync_dir_of(const char *path)
{
	char *copy = strdup(path);
	int fd, r;

	if (!copy)
		return -ENOMEM;
	fd = nvio__open(dirname(copy), O_RDONLY | O_DIRECTORY, 0);
	free(copy);
	if (fd < 0)
		return fd;
	r = nvio__sys.fsync(fd) < 0 ? -errno : 0;
	nvio__sys.close(fd);
	return r;
}

/* Closes one of the op's descriptors; a failed close of a write's is the
 * op's failure (returns -errno). EINTR has closed it all the same. */
static int close_checked(struct nvio__op *op, int fd)
{
	int err;

	if (nvio__sys.close(fd) == 0 || !op->is_write || errno == EINTR)
		return 0;
	err = -errno;
	nvio__op_fail(op, err, "close", op->plan.off, op->plan.len);
	return err;
}

static void epilogue(struct nvio__op *op)
{
	int err = atomic_load(&op->err), r;

	if (!err && (op->flags & NVIO_VALIDATE))
		err = validate(op);
	if (!err && op->is_write && (op->flags & NVIO_FSYNC) &&
	    nvio__sys.fsync(op->fd) < 0) {
		err = -errno;
		nvio__op_fail(op, err, "fsync", op->plan.off, op->plan.len);
	}
	if (!err && op->tmp_path && op->keep_mode && fchmod(op->fd, op->tmp_mode) < 0) {
		err = -errno;
		nvio__op_fail(op, err, "chmod", 0, op->plan.len);
	}
	nvio__cufile_op_close(op);
	/* A write's close can report what writeback found (NFS): it decides
	 * like any other error whether a temporary replaces the file. */
	if (op->own_dfd && (r = close_checked(op, op->dfd)) && !err)
		err = r;
	if (op->own_fd && (r = close_checked(op, op->fd)) && !err)
		err = r;
	op->own_fd = op->own_dfd = 0;
	if (op->tmp_path && !err && nvio__sys.rename(op->tmp_path, op->target) < 0) {
		err = -errno;
		nvio__op_fail(op, err, "rename", 0, op->plan.len);
	}
	if (op->tmp_path && err)
		nvio__sys.unlink(op->tmp_path);
	if (op->tmp_path && !err && (op->flags & NVIO_FSYNC)) {
		err = fsync_dir_of(op->target);
		if (err)
			nvio__op_fail(op, err, "fsync directory", 0, 0);
	}
}

static void report(struct nvio__op *op)
{
	struct nvio_handle *h = op->h;
	int err = atomic_load(&op->err);
	/* Read before unlocking: a woken sync submitter frees the op. */
	int async = (op->flags & NVIO_ASYNC) != 0;

	pthread_mutex_lock(&h->lock);
	if (async) {
		struct nvio__gen *g = &h->gens[op->gen];

		g->inflight--;
		g->done++;
		if (err && !g->err) {
			g->err = err;
			nvio__op_record(op, &g->rec);
		}
	} else {
		op->done = 1;
	}
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	/* A sync op belongs to its submitter, which frees it after waking. */
	if (async)
		nvio__op_free(op);
}

void nvio__op_task_done(struct nvio__op *op)
{
	if (atomic_fetch_sub(&op->tasks_left, 1) != 1)
		return;
	epilogue(op);
	report(op);
}

void nvio__op_free(struct nvio__op *op)
{
	nvio__cufile_op_close(op);
	if (op->own_dfd)
		nvio__sys.close(op->dfd);
	if (op->own_fd)
		nvio__sys.close(op->fd);
	free(op->path);
	free(op->tmp_path);
	free(op->target);
	free(op);
}

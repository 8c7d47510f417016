/*
 * op.c - how an accepted op ends.
 *
 * When the last task of an op is done, the thread that finished it
 * (a worker, or the submitter for an op with no pieces) runs the op's
 * epilogue: validation, fsync, the commit of a whole-file write, closing
 * a private file; then track.c reports the op exactly once.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

void nvio__op_record(const struct nvio__op *op, nvio_error_t *e)
{
	nvio__error_fill(e, atomic_load(&op->err), op, op->fail_what,
			 op->fail_off, op->fail_len);
}

/* The op's bytes at [pos, pos + n) into host memory dst. */
static int copy_out(const struct nvio__op *op, void *dst, uint64_t pos, uint64_t n,
		    struct nvio__cuda_ctx *cuda)
{
	unsigned char *d = dst;
	int r;

	if (op->mem == NVIO__MEM_HOST) {
		nvio__op_gather(op, dst, pos, n);
		return 0;
	}
	if (!cuda->stream && (r = nvio__cuda_ctx_open(cuda, op->cuda_device)) < 0)
		return r;
	while (n > 0) {	/* a part of one buffer at a time */
		uint64_t k;
		const unsigned char *src = nvio__op_at(op, pos, &k);

		if (k > n)
			k = n;
		if ((r = nvio__cuda_copy(d, src, (size_t)k, 0, cuda)) < 0)
			return r;
		d += k;
		pos += k;
		n -= k;
	}
	return 0;
}

/*
 * Re-reads the op's ranges through the page cache (direct writes have
 * invalidated it, so this reads what the device holds) and compares.
 */
static int validate(struct nvio__op *op)
{
	size_t blk = 1u << 20;
	unsigned char *tmp = malloc(blk), *cmp = malloc(blk);
	struct nvio__cuda_ctx cuda = { 0 };
	int fd, r = tmp && cmp ? 0 : -ENOMEM;

	/* the file the op moved, whatever its name is now */
	fd = r ? r : nvio__reopen(op->file->fd, NULL, O_RDONLY, NULL);
	if (fd < 0) {
		nvio__op_fail(op, fd, "validate open", op->ext[0].plan.off, op->nbytes);
		r = fd;
	}
	for (uint32_t e = 0; !r && e < op->next; e++) {
		const struct nvio__extent *x = &op->ext[e];

		for (uint64_t done = 0; !r && done < x->plan.len; done += blk) {
			size_t n = x->plan.len - done < blk ? x->plan.len - done : blk;
			uint64_t off = x->plan.off + done;

			r = nvio__pread_full(fd, tmp, n, off);
			if (!r)
				r = copy_out(op, cmp, x->pos + done, n, &cuda);
			if (!r && memcmp(tmp, cmp, n))
				r = -EBADMSG;
			if (r)
				nvio__op_fail(op, r, "validate", off, n);
		}
	}
	nvio__cuda_ctx_close(&cuda);
	free(tmp);
	free(cmp);
	if (fd >= 0)
		nvio__sys.close(fd);
	return r;
}

/*
 * After the pieces: validation, fsync, and for an op on a private file
 * (the one-buffer calls) its closing, with the commit of a whole-file
 * write. A failed close of a written file is the op's failure and keeps
 * a whole-file write from replacing the old file (NFS reports writeback
 * errors at close).
 */
static void epilogue(struct nvio__op *op)
{
	struct nvio_file *f = op->file;
	int err = atomic_load(&op->err), durable = (op->flags & NVIO_FSYNC) != 0;
	const char *what = "close";

	if (!err && op->crc32)
		nvio__op_crc_finish(op);
	if (!err && (op->flags & NVIO_VALIDATE))
		err = validate(op);
	if (!err && op->is_write && durable && nvio__sys.fsync(f->fd) < 0) {
		err = -errno;
		nvio__op_fail(op, err, "fsync", op->ext[0].plan.off, op->nbytes);
	}
	if (op->is_write && err) {
		atomic_store(&f->failed, 1);
		if (op->grew_to)	/* no file grown with zeros, no space held */
			nvio__file_shrink_back(f, op->grew_to, op->grew_from);
	}
	if (!f->private)
		return;
	if (!err && (f->flags & NVIO_FILE_ATOMIC)) {
		err = nvio__file_commit(f, durable, &what);
		if (err)
			nvio__op_fail(op, err, what, 0, op->nbytes);
	} else if ((err = nvio__file_close_fds(f)) < 0 && op->is_write) {
		nvio__op_fail(op, err, "close", op->ext[0].plan.off, op->nbytes);
	}
}

void nvio__op_finish_inline(struct nvio__op *op)
{
	epilogue(op);
}

void nvio__op_task_done(struct nvio__op *op)
{
	if (atomic_fetch_sub(&op->tasks_left, 1) != 1)
		return;
	if (op->sink == NVIO__SINK_QUEUE)
		nvio__track_ending(op);	/* no cancel from here on */
	epilogue(op);
	if (nvio__track_end(op))
		nvio__op_free(op);
}

void nvio__op_free(struct nvio__op *op)
{
	if (op->own_file)	/* nobody else has it: no use after a close */
		nvio__file_free(op->file);
	if (op->segs != &op->seg1)
		free(op->segs);
	if (op->ext != &op->ext1)
		free(op->ext);
	free(op->crc_parts);
	if (op->on_heap)
		free(op);
}

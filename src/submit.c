/*
 * submit.c - from a call to an accepted op.
 *
 * Everything that can be refused is checked here, in the caller's thread,
 * before any byte moves: arguments, opening the file, the file's size for
 * reads, whether O_DIRECT applies. A refused op returns its error and
 * never completes. An accepted op is cut into pieces (plan.c) and each
 * worker gets its run of pieces.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

#define KNOWN_FLAGS (NVIO_ASYNC | NVIO_VALIDATE | NVIO_FSYNC)

/* What the caller asked for. */
struct request {
	unsigned char *buf;
	uint64_t nbytes;
	const char *path;	/* NULL for the _fd calls */
	int by_path;		/* a call that takes a path (maybe NULL) */
	int fd;
	int64_t offset;
	unsigned flags;
	int is_write;
	int whole_file;		/* read_file / write_file */
	uint64_t capacity;	/* read_file */
	uint64_t *size_out;
	struct stat st;		/* of the buffered descriptor, once open */
};

static struct nvio__op *op_new(struct nvio_handle *h, const struct request *rq)
{
	struct nvio__op *op;

	op = calloc(1, sizeof(*op) + h->nworkers * sizeof(op->tasks[0]));
	if (!op)
		return NULL;
	op->h = h;
	op->seq = atomic_fetch_add(&h->seq, 1) + 1;
	op->flags = rq->flags;
	op->is_write = rq->is_write;
	op->buf = rq->buf;
	op->fd = op->dfd = -1;
	if (rq->path) {
		op->path = strdup(rq->path);
		op->by_path = 1;
	} else if ((op->path = malloc(32)) != NULL) {
		snprintf(op->path, 32, "fd %d", rq->fd);
	}
	if (!op->path) {
		free(op);
		return NULL;
	}
	return op;
}

/*
 * The name a write through path would reach, as open(2) follows it: the
 * symbolic links of the last component followed (a link's relative
 * target is relative to the link's directory; a dangling link gives the
 * name it points to, which open would create). Directories in path are
 * followed by the kernel anyway. Sets *out to a malloc'd name.
 */
static int follow_links(const char *path, char **out)
{
	char *cur = strdup(path), *link = malloc(PATH_MAX), *next;
	struct stat st;
	int err = -ENOMEM;

	for (int hops = 0; cur && link; hops++) {
		ssize_t n;
		size_t dlen;

		if (lstat(cur, &st) < 0 || !S_ISLNK(st.st_mode)) {
			free(link);
			*out = cur;	/* errors are open's to report */
			return 0;
		}
		err = -ELOOP;	/* open's limit on links in a name */
		if (hops == 40)
			break;
		n = readlink(cur, link, PATH_MAX);
		err = n < 0 ? -errno : -ENAMETOOLONG;
		if (n < 0 || n == PATH_MAX)
			break;
		link[n] = 0;
		/* relative: beside the link, after cur's last '/' */
		dlen = link[0] == '/' || !strrchr(cur, '/') ? 0 :
		       (size_t)(strrchr(cur, '/') - cur) + 1;
		err = -ENOMEM;
		next = malloc(dlen + (size_t)n + 1);
		if (!next)
			break;
		memcpy(next, cur, dlen);
		memcpy(next + dlen, link, (size_t)n + 1);
		free(cur);
		cur = next;
	}
	free(cur);
	free(link);
	return err;
}

/*
 * A fresh name beside the target for a whole-file write. The target is
 * path with its links followed (follow_links), so a link stays a link
 * and the file it names is replaced, as a plain open and write would.
 * A file being replaced keeps its permissions: the temporary is made
 * 0600, so that nvio can reopen it (O_DIRECT, validate) whatever they
 * are, and takes them just before the rename (op.c). A new file gets
 * 0666 less umask.
 */
static int open_temp(struct nvio__op *op)
{
	char *copy = NULL, *dir, *base;
	int fd = follow_links(op->path, &op->target);
	struct stat st;
	mode_t mode = 0666;
	size_t len;

	if (fd < 0)
		return fd;
	len = strlen(op->target) + 32;
	fd = -EEXIST;
	copy = strdup(op->target);
	op->tmp_path = malloc(len);
	if (!copy || !op->tmp_path) {
		fd = -ENOMEM;
	} else if (stat(op->target, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			fd = -EISDIR;
		op->tmp_mode = st.st_mode & 07777;
		op->keep_mode = 1;
		mode = 0600;
	}
	if (fd != -EEXIST) {
		free(copy);
		free(op->tmp_path);
		op->tmp_path = NULL;
		return fd;
	}
	dir = dirname(copy);
	base = strrchr(op->target, '/') ? strrchr(op->target, '/') + 1 :
	       op->target;
	for (int i = 0; i < 100 && fd == -EEXIST; i++) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		snprintf(op->tmp_path, len, "%s/.%s.nvio-%lx", dir, base,
			 (unsigned long)(ts.tv_nsec ^ (op->seq << 20) ^ (unsigned)i ^
					 (unsigned long)getpid() << 32));
		fd = nvio__open(op->tmp_path, O_WRONLY | O_CREAT | O_EXCL, mode);
	}
	free(copy);
	if (fd < 0) {
		free(op->tmp_path);
		op->tmp_path = NULL;
	}
	return fd;
}

/* Opens (or adopts) the buffered descriptor. */
static int open_main(struct nvio__op *op, const struct request *rq)
{
	int fl, fd;

	if (rq->path && rq->whole_file && rq->is_write)
		fd = open_temp(op);
	else if (rq->path)
		fd = nvio__open(rq->path, rq->is_write ? O_WRONLY | O_CREAT : O_RDONLY,
				0666);
	else
		fd = -1;
	if (rq->path) {
		if (fd < 0)
			return fd;
		op->fd = fd;
		op->own_fd = 1;
		return 0;
	}
	fl = fcntl(rq->fd, F_GETFL);
	if (fl < 0)
		return -EBADF;
	if ((fl & O_ACCMODE) == (rq->is_write ? O_RDONLY : O_WRONLY))
		return -EBADF;
	if (!(fl & (O_DIRECT | O_APPEND))) {
		op->fd = rq->fd;
		return 0;
	}
	/* O_APPEND would ignore offsets, O_DIRECT forbids unaligned pieces:
	 * use a plain descriptor of our own for the same file. */
	char p[64];

	snprintf(p, sizeof(p), "/proc/self/fd/%d", rq->fd);
	fd = nvio__open(p, rq->is_write ? O_WRONLY : O_RDONLY, 0);
	if (fd < 0)
		return fd;
	op->fd = fd;
	op->own_fd = 1;
	return 0;
}

/* The file's size for reads: regular files and block devices; any other
 * (pipes, character devices) has none: UINT64_MAX. */
static int file_size(int fd, const struct stat *st, uint64_t *size)
{
	if (S_ISDIR(st->st_mode))
		return -EISDIR;
	if (S_ISBLK(st->st_mode))
		return ioctl(fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
	*size = S_ISREG(st->st_mode) ? (uint64_t)st->st_size : UINT64_MAX;
	return 0;
}

/*
 * The offset alignment O_DIRECT needs for this file, 0 if the file
 * system cannot do direct I/O. Sets *mem_align for buffers.
 */
static uint32_t dio_align(int fd, uint32_t *mem_align)
{
	struct statx sx;

	*mem_align = NVIO__PAGE;
	if (nvio__sys.statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) < 0 ||
	    !(sx.stx_mask & STATX_DIOALIGN))
		return NVIO__PAGE;	/* unknown: page alignment is safe */
	*mem_align = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : NVIO__PAGE;
	return sx.stx_dio_offset_align;
}

/* The O_DIRECT descriptor: the caller's, or a new one for the very file
 * op->fd has open, even if its path was replaced meanwhile (nvio__reopen). */
static int open_direct(struct nvio__op *op, const struct request *rq)
{
	int acc = op->is_write ? O_WRONLY : O_RDONLY;
	int fl;

	if (op->dfd >= 0)
		return 0;	/* already open (a GDS attempt) */
	if (!rq->path) {
		fl = fcntl(rq->fd, F_GETFL);
		if ((fl & O_DIRECT) && !(fl & O_APPEND)) {
			op->dfd = rq->fd;
			return 0;
		}
	}
	op->dfd = nvio__reopen(op->fd, op->tmp_path ? op->tmp_path : rq->path,
			       acc | O_DIRECT, &rq->st);
	if (op->dfd < 0)
		return op->dfd;
	op->own_dfd = 1;
	return 0;
}

/*
 * GPU memory on a GDS handle: cuFile takes the whole range (it handles
 * unaligned pieces itself) through one registration of the descriptor.
 * Returns 1 if cuFile took the op, 0 to use the bounce path instead.
 */
static int plan_gds(struct nvio_handle *h, struct nvio__op *op,
		    const struct request *rq, uint64_t nbytes)
{
	if (!h->gds || op->mem != NVIO__MEM_CUDA)
		return 0;
	if (h->cfg.direct != NVIO_DIRECT_OFF && open_direct(op, rq) < 0)
		op->dfd = -1;	/* compatibility mode takes a plain fd */
	if (nvio__cufile_op_open(op, op->dfd >= 0 ? op->dfd : op->fd) < 0)
		return 0;
	nvio__plan_make(&op->plan, (uint64_t)rq->offset, nbytes,
			h->cfg.block_size, 0);
	return 1;
}

/*
 * Direct writes that extend a file make ext4 and xfs take the slow,
 * blocking path for every request (io_uring then hands each one to a
 * kernel worker thread). Allocating the new range first turns them into
 * writes inside the file. It also reports a full disk (-ENOSPC) before
 * any byte is written. The file reaches offset + nbytes either way.
 */
static int preallocate(struct nvio__op *op, const struct stat *st)
{
	uint64_t end = op->plan.off + op->plan.len;
	uint64_t start = (uint64_t)st->st_size;

	if (!S_ISREG(st->st_mode) || end <= start)
		return 0;
	if (op->plan.off > start)
		start = op->plan.off;	/* a gap before the range stays a hole */
	if (nvio__sys.fallocate(op->fd, 0, (off_t)start, (off_t)(end - start)) == 0)
		return 0;
	/* Not supported here: the writes will extend the file themselves. */
	return errno == ENOSPC || errno == EFBIG || errno == EDQUOT ? -errno : 0;
}

/*
 * The op moves through the page cache: an O_DIRECT descriptor already
 * opened (for cuFile, which then refused the file) must not take its
 * pieces, which need not be aligned.
 */
static void drop_direct(struct nvio__op *op)
{
	if (op->own_dfd)
		nvio__sys.close(op->dfd);
	op->dfd = -1;
	op->own_dfd = 0;
	op->stage = 0;
}

/*
 * Plans the op and decides on O_DIRECT and staging. A body chunk is the
 * block rounded up to the alignment; the bounce buffers hold the block
 * rounded up to the page. Where the alignment is coarser than both, a
 * staged chunk would not fit: AUTO then moves the op buffered, ON
 * refuses it (*what says why).
 */
static int plan_op(struct nvio_handle *h, struct nvio__op *op,
		   const struct request *rq, uint64_t nbytes, const char **what)
{
	const uint64_t off = (uint64_t)rq->offset;
	int policy = h->cfg.direct;
	uint32_t mem_align = 0, align = 0;
	uint64_t body;
	int r;

	if (plan_gds(h, op, rq, nbytes))
		return 0;
	if (policy != NVIO_DIRECT_OFF) {
		align = dio_align(op->fd, &mem_align);
		if (align == 0 && policy == NVIO_DIRECT_ON)
			return -EINVAL;	/* the file system has no direct I/O */
	}
	nvio__plan_make(&op->plan, off, nbytes, h->cfg.block_size, align);
	if (op->plan.body == 0 && align && op->mem != NVIO__MEM_HOST) {
		/* Nothing goes direct. The head could be up to twice the
		 * alignment: GPU memory moves in blocks, which fit. */
		align = 0;
		nvio__plan_make(&op->plan, off, nbytes, h->cfg.block_size, 0);
	}
	if (op->plan.body == 0 || !align) {
		drop_direct(op);
		return 0;
	}
	/* All body pieces share one alignment relative to mem_align. */
	op->stage = ((uintptr_t)(op->buf + op->plan.head) % mem_align) != 0;
	body = op->plan.body < op->plan.chunk ? op->plan.body : op->plan.chunk;
	r = 0;
	if ((op->stage || op->mem != NVIO__MEM_HOST) &&
	    body > h->workers[0].stage.size) {
		*what = "staging (block < alignment)";
		r = -EINVAL;
	}
	if (!r)
		r = open_direct(op, rq);
	/* AUTO: whatever refuses O_DIRECT here (the file system, a socket,
	 * the file's mode for a new open, the alignment), buffered I/O
	 * still works */
	if (r < 0 && policy == NVIO_DIRECT_AUTO) {
		drop_direct(op);
		nvio__plan_make(&op->plan, off, nbytes, h->cfg.block_size, 0);
		return 0;
	}
	return r;
}

/*
 * The arguments of a call, before anything is opened. Returns 0, or the
 * error with *what naming the argument.
 */
static int check_request(struct nvio_handle *h, const struct request *rq,
			 const char **what)
{
	int err = 0;

	if (rq->by_path && !rq->path) {
		*what = "path (NULL)";
		err = -EINVAL;
	} else if (!h || (rq->flags & ~KNOWN_FLAGS)) {
		*what = "flags";
		err = -EINVAL;
	} else if (!rq->buf && (rq->nbytes > 0 || rq->capacity > 0)) {
		*what = "buffer (NULL)";
		err = -EINVAL;
	} else if (rq->path && rq->path[0] == '\0') {
		*what = "open (empty path)";
		err = -ENOENT;
	} else if (!rq->path && rq->fd < 0) {
		*what = "fd (negative)";
		err = -EBADF;
	} else if (rq->offset < 0 ||
		   rq->nbytes > (uint64_t)(INT64_MAX - rq->offset)) {
		*what = "range (past INT64_MAX)";
		err = -EINVAL;
	}
	return err;
}

/*
 * A call refused before it became an op. Its error is still the calling
 * thread's nvio_last_error(), as the man page promises for every failed
 * call on a handle; op_seq 0 says that no op was made.
 */
static int refuse(struct nvio_handle *h, const struct request *rq, int err,
		  const char *what)
{
	nvio_error_t e;

	if (!h)
		return err;
	nvio__error_fill(&e, err, NULL, what, (uint64_t)rq->offset, rq->nbytes);
	e.is_write = rq->is_write;
	if (rq->path)
		snprintf(e.path, sizeof(e.path), "%s", rq->path);
	else if (!rq->by_path)
		snprintf(e.path, sizeof(e.path), "fd %d", rq->fd);
	return nvio__error_publish(h, &e);
}

/*
 * A sync op of one piece that needs no bounce buffer runs in the caller's
 * thread, through the same completion checks as in a worker. Handing it
 * to a worker and back costs two thread wake-ups: 200 us for a 4 KiB
 * cached read on our VM, whose system calls take 5 us.
 */
static int inline_ok(const struct nvio__op *op)
{
	uint64_t off, len;
	int body;

	if ((op->flags & NVIO_ASYNC) || op->plan.npieces != 1 ||
	    op->mem != NVIO__MEM_HOST || op->cufh)
		return 0;
	nvio__plan_piece(&op->plan, 0, &off, &len, &body);
	return !(body && op->stage);
}

/*
 * The error of an op that has ended, 0 if none; a failure becomes the
 * calling thread's nvio_last_error(), as the call returns it.
 */
static int op_error(const struct nvio__op *op)
{
	nvio_error_t e;
	int err = atomic_load(&op->err);

	if (err) {
		nvio__op_record(op, &e);
		nvio__error_publish(op->h, &e);
	}
	return err;
}

static int run_inline(struct nvio__op *op)
{
	struct nvio__io io = { .is_write = op->is_write, .buf = op->buf };
	uint64_t off, len;
	ssize_t r;
	int body, err;

	nvio__plan_piece(&op->plan, 0, &off, &len, &body);
	io.fd = body && op->dfd >= 0 ? op->dfd : op->fd;
	io.len = (size_t)len;
	io.off = off;
	do {
		r = op->is_write ? nvio__sys.pwrite(io.fd, io.buf, io.len, (off_t)off) :
				   nvio__sys.pread(io.fd, io.buf, io.len, (off_t)off);
		r = nvio__sys.io_result(io.is_write, io.fd, off, io.len, r < 0 ? -errno : r);
	} while (r == -EINTR || r == -EAGAIN);
	if (r < 0)
		err = (int)r;
	else
		err = (size_t)r < io.len ? nvio__finish_short(op, &io, (size_t)r) : 0;
	if (err)
		nvio__op_fail(op, err, op->is_write ? "pwrite" : "pread", off, len);
	atomic_store(&op->tasks_left, 1);
	nvio__op_task_done(op);		/* epilogue, report: op->done is set */
	err = op_error(op);
	nvio__op_free(op);
	return err;
}

/*
 * Hands the pieces to the workers and, for a sync op, waits for it.
 * Once the last task is pushed an async op may end and be freed at any
 * moment, so nothing reads it after that push.
 */
static int run_op(struct nvio_handle *h, struct nvio__op *op)
{
	int async = (op->flags & NVIO_ASYNC) != 0;
	unsigned busy = 0, last = 0;
	int err;

	if (inline_ok(op))
		return run_inline(op);
	for (unsigned w = 0; w < h->nworkers; w++) {
		struct nvio__task *t = &op->tasks[w];

		t->op = op;
		nvio__plan_slice(&op->plan, w, h->nworkers, &t->next_piece,
				 &t->end_piece);
		t->left = t->end_piece - t->next_piece;
		if (t->left > 0) {
			busy++;
			last = w;
		}
	}
	atomic_store(&op->tasks_left, busy ? busy : 1);
	if (async) {
		pthread_mutex_lock(&h->lock);
		op->gen = h->gen & 1;
		h->gens[op->gen].inflight++;
		pthread_mutex_unlock(&h->lock);
	}
	if (!busy)
		nvio__op_task_done(op);	/* nothing to move: ends here */
	for (unsigned w = 0; busy && w <= last; w++)
		if (op->tasks[w].left > 0)
			nvio__worker_push(&h->workers[w], &op->tasks[w]);
	if (async)
		return 0;
	pthread_mutex_lock(&h->lock);
	while (!op->done)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
	err = op_error(op);
	nvio__op_free(op);
	return err;
}

static int submit(struct nvio_handle *h, struct request *rq)
{
	struct nvio__op *op;
	struct stat *st = &rq->st;
	uint64_t size = 0, nbytes = rq->nbytes;
	const char *what = "open";
	int r = check_request(h, rq, &what);

	if (r)
		return refuse(h, rq, r, what);
	op = op_new(h, rq);
	if (!op)
		return refuse(h, rq, -ENOMEM, "memory");
	r = nvio__cuda_pointer_device(rq->buf, &op->cuda_device);
	if (r > 0)
		op->mem = NVIO__MEM_CUDA;
	if (r < 0)
		what = "CUDA pointer query";
	else
		r = open_main(op, rq);
	if (!r && nvio__sys.fstat(op->fd, st) < 0) {
		what = "stat";
		r = -errno;
	}
	if (!r && !rq->is_write) {
		what = "stat";
		r = file_size(op->fd, st, &size);
		if (!r && rq->whole_file && size == UINT64_MAX) {
			what = "size (not a file or device)";
			r = -EINVAL;	/* a pipe or character device */
		} else if (!r && rq->whole_file) {
			nbytes = size;
			if (rq->size_out)
				*rq->size_out = size;
			if (size > rq->capacity)
				r = -EOVERFLOW;
		} else if (!r && (uint64_t)rq->offset + nbytes > size) {
			r = -ENODATA;
		}
	}
	if (!r) {
		what = "open O_DIRECT";
		r = plan_op(h, op, rq, nbytes, &what);
	}
	/* Not a file or block device: AIO refuses those, move it plainly. */
	if (!r && op->mem == NVIO__MEM_HOST && !op->cufh && op->dfd < 0)
		op->plain = !S_ISREG(st->st_mode) && !S_ISBLK(st->st_mode);
	if (!r && rq->is_write) {
		what = "fallocate";
		r = preallocate(op, st);
	}
	if (r) {
		nvio__op_fail(op, r, what, (uint64_t)rq->offset, nbytes);
		op_error(op);
		if (op->tmp_path)
			nvio__sys.unlink(op->tmp_path);
		nvio__op_free(op);
		return r;
	}
	return run_op(h, op);
}

int nvio_pread(nvio_handle_t *h, void *buf, uint64_t nbytes, const char *path,
	       int64_t offset, unsigned flags)
{
	struct request rq = { .buf = buf, .nbytes = nbytes, .path = path,
			      .by_path = 1, .offset = offset, .flags = flags };

	return submit(h, &rq);
}

int nvio_pwrite(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		const char *path, int64_t offset, unsigned flags)
{
	struct request rq = { .buf = (unsigned char *)buf, .nbytes = nbytes,
			      .path = path, .by_path = 1, .offset = offset,
			      .flags = flags, .is_write = 1 };

	return submit(h, &rq);
}

int nvio_pread_fd(nvio_handle_t *h, void *buf, uint64_t nbytes, int fd,
		  int64_t offset, unsigned flags)
{
	struct request rq = { .buf = buf, .nbytes = nbytes, .fd = fd,
			      .offset = offset, .flags = flags };

	return submit(h, &rq);
}

int nvio_pwrite_fd(nvio_handle_t *h, const void *buf, uint64_t nbytes, int fd,
		   int64_t offset, unsigned flags)
{
	struct request rq = { .buf = (unsigned char *)buf, .nbytes = nbytes,
			      .fd = fd, .offset = offset, .flags = flags,
			      .is_write = 1 };

	return submit(h, &rq);
}

int nvio_read_file(nvio_handle_t *h, void *buf, uint64_t capacity,
		   const char *path, uint64_t *size_out, unsigned flags)
{
	struct request rq = { .buf = buf, .capacity = capacity, .path = path,
			      .by_path = 1, .flags = flags, .whole_file = 1,
			      .size_out = size_out };

	return submit(h, &rq);
}

int nvio_write_file(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		    const char *path, unsigned flags)
{
	struct request rq = { .buf = (unsigned char *)buf, .nbytes = nbytes,
			      .path = path, .by_path = 1, .flags = flags,
			      .is_write = 1, .whole_file = 1 };

	return submit(h, &rq);
}

int64_t nvio_file_size(const char *path)
{
	struct stat st;

	if (!path)
		return -EINVAL;
	if (stat(path, &st) < 0)
		return -errno;
	return st.st_size;
}

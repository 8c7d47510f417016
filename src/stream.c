/*
 * stream.c - an append-only writer and a read-ahead reader over an open
 * file, for callers that produce or consume bytes in small pieces (a zip
 * writer, a pickler) but want the device's speed.
 *
 * A writer copies into page-aligned locked buffers; a full buffer is
 * written with one async op (O_DIRECT for its aligned body) while the
 * caller fills the next. A large write from memory O_DIRECT can take,
 * at an aligned position, goes straight from the caller's memory. Close
 * writes what is left (its unaligned tail through the page cache: the op
 * path cuts it) and sets the file's size to exactly where the stream
 * ended.
 *
 * A reader keeps up to `depth` windows of the file in flight or ready,
 * each one buffer long, at multiples of the buffer size from an aligned
 * base, so every window read is one aligned op. A large read that no
 * window holds goes straight into the caller's memory.
 *
 * A writer may instead stage in the caller's memory (0.3,
 * nvio_stream_open_config: DeepSpeed's pinned staging tensor, host or
 * CUDA memory), cut into its buffers: nothing is allocated and no byte is
 * copied twice. A writer of ranges (NVIO_STREAM_RANGES: a share of a
 * file others write too) may seek, and leaves the file's size alone.
 *
 * Each buffer's op reports to the buffer's own group (track.c), so a
 * stream never consumes completions or nvio_wait reports of its caller.
 * A stream is used by one thread at a time; its first error sticks.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_BUFFER (8ull << 20)
#define MAX_DEPTH 64u

struct sbuf {
	unsigned char *mem;
	uint64_t off;		/* file offset of mem[0] */
	uint64_t len;		/* bytes it holds (writer: filled) */
	int busy;		/* an op on it may be in flight */
	int valid;		/* reader: holds [off, off + len) */
	struct nvio__group g;
};

struct nvio_stream {
	struct nvio_file *f;
	struct nvio_handle *h;
	int writer;
	int ranges;		/* NVIO_STREAM_RANGES: seekable writer, size kept */
	int caller_mem;		/* the buffers are the caller's memory: not freed */
	int dev_mem;		/* ... and it is CUDA memory: copied by the driver */
	uint64_t bufsz;		/* bytes per buffer, a multiple of unit */
	uint64_t unit;		/* O_DIRECT alignment unit (page at least) */
	unsigned nbuf;
	unsigned cur;		/* writer: the buffer being filled */
	uint64_t pos;		/* next byte's file offset */
	uint64_t end;		/* reader: the file's size */
	int err;		/* first error, sticky */
	nvio_error_t rec;	/* its record */
	struct sbuf bufs[];
};

/* The stream's first error sticks; its record is the caller's
 * nvio_last_error() each time a call returns it. */
static int fail(struct nvio_stream *s, int err, const nvio_error_t *rec)
{
	if (!s->err) {
		s->err = err;
		if (rec)
			s->rec = *rec;
		else
			nvio__error_fill(&s->rec, err, NULL, "stream", s->pos, 0);
		if (!s->rec.path[0])
			strncpy(s->rec.path, s->f->path, sizeof(s->rec.path) - 1);
	}
	return nvio__error_publish(s->h, &s->rec);
}

/* Waits for the buffer's op; its failure becomes the stream's. */
static int settle(struct nvio_stream *s, struct sbuf *b)
{
	if (!b->busy)
		return 0;
	nvio__group_wait(s->h, &b->g);
	b->busy = 0;
	if (b->g.err) {
		int err = b->g.err;

		b->g.err = 0;
		b->valid = 0;
		return fail(s, err, &b->g.rec);
	}
	return 0;
}

static int settle_all(struct nvio_stream *s)
{
	int err = 0;

	for (unsigned i = 0; i < s->nbuf; i++) {
		int r = settle(s, &s->bufs[i]);

		if (r && !err)
			err = r;
	}
	return err;
}

/* An op of the stream: async into the buffer's group, or sync. */
static int stream_op(struct nvio_stream *s, struct sbuf *b, void *mem,
		     uint64_t len, uint64_t off)
{
	struct nvio__opspec sp = {
		.file = s->f, .is_write = s->writer, .buf = mem, .nbytes = len,
		.offset = (int64_t)off,
		.sink = b ? NVIO__SINK_GROUP : NVIO__SINK_SYNC,
		.group = b ? &b->g : NULL,
	};
	int r;

	if (b)
		b->busy = 1;
	r = nvio__submit(s->h, &sp);
	if (r < 0) {
		nvio_error_t e = { .struct_size = sizeof(e) };

		if (b)
			b->busy = 0;
		nvio_last_error(s->h, &e);
		return fail(s, r, e.err == r ? &e : NULL);
	}
	return 0;
}

/* The caller's memory, cut into n buffers of bufsz (a multiple of unit
 * each, at least one unit: else -EINVAL). */
static int use_memory(struct nvio_stream *s, const nvio_stream_config_t *c, unsigned n)
{
	uint64_t part = c->buffer_bytes / n / s->unit * s->unit;
	int dev;

	if (!part)
		return -EINVAL;
	s->bufsz = part;
	s->caller_mem = 1;
	s->dev_mem = nvio__cuda_pointer_device(c->memory, &dev) == 1;
	for (unsigned i = 0; i < n; i++)
		s->bufs[i].mem = (unsigned char *)c->memory + i * part;
	return 0;
}

/* A config from a caller built against this or a later header: known
 * flags, its reserved fields 0; memory for writers only, 1 or 2 buffers. */
static int config_valid(const nvio_file_t *f, const nvio_stream_config_t *c)
{
	unsigned mode = c->flags & (NVIO_STREAM_READ | NVIO_STREAM_WRITE);
	const unsigned char *p = (const unsigned char *)c;
	size_t known = offsetof(nvio_stream_config_t, reserved);

	if (c->struct_size < offsetof(nvio_stream_config_t, memory) + sizeof(c->memory) ||
	    c->reserved0 || (c->flags & ~(mode | NVIO_STREAM_RANGES)) ||
	    (mode != NVIO_STREAM_READ && mode != NVIO_STREAM_WRITE) ||
	    c->offset < 0 || c->depth > MAX_DEPTH || c->buffer_bytes > NVIO__MAX_BLOCK)
		return 0;
	for (size_t i = known; i < c->struct_size; i++)
		if (p[i])
			return 0;
	if (mode == NVIO_STREAM_READ)
		return !c->memory && !(c->flags & NVIO_STREAM_RANGES);
	return !c->memory || (c->buffer_bytes && c->depth <= 2);
}

static struct nvio_stream *stream_make(nvio_file_t *f, const nvio_stream_config_t *c,
				       int *err)
{
	struct nvio_stream *s = NULL;
	unsigned mode = c->flags & (NVIO_STREAM_READ | NVIO_STREAM_WRITE), n;
	uint64_t unit, bufsz;
	int r = 0;

	if (!f || !config_valid(f, c))
		r = -EINVAL;
	else if (!(f->flags & (mode == NVIO_STREAM_WRITE ? NVIO_FILE_WRITE : NVIO_FILE_READ)))
		r = -EBADF;
	if (!r && nvio__forked(f->h))
		r = -ECHILD;
	if (r)
		goto out;
	unit = f->align > NVIO__PAGE ? f->align : NVIO__PAGE;
	bufsz = c->buffer_bytes ? c->buffer_bytes : DEFAULT_BUFFER;
	bufsz = (bufsz + unit - 1) / unit * unit;
	n = c->depth ? c->depth : 2;
	if (mode == NVIO_STREAM_WRITE && !c->memory)
		n = 2;
	s = calloc(1, sizeof(*s) + n * sizeof(s->bufs[0]));
	if (!s) {
		r = -ENOMEM;
		goto out;
	}
	s->f = f;
	s->h = f->h;
	s->writer = mode == NVIO_STREAM_WRITE;
	s->ranges = !!(c->flags & NVIO_STREAM_RANGES);
	s->unit = unit;
	s->bufsz = bufsz;
	s->nbuf = n;
	s->pos = (uint64_t)c->offset;
	s->end = atomic_load(&f->size);
	if (c->memory)
		r = use_memory(s, c, n);
	for (unsigned i = 0; i < n && !r; i++) {
		if (!c->memory)
			r = nvio_mem_alloc((void **)&s->bufs[i].mem, bufsz, 0, NULL);
		s->bufs[i].off = s->pos;
	}
	if (r) {
		for (unsigned i = 0; i < n && !s->caller_mem; i++)
			nvio_mem_free(s->bufs[i].mem);
		free(s);
		s = NULL;
	}
out:
	if (err)
		*err = r;
	return s;
}

nvio_stream_t *nvio_stream_open(nvio_file_t *f, unsigned flags, int64_t offset,
				uint64_t buffer_bytes, unsigned depth, int *err)
{
	nvio_stream_config_t c = {
		.struct_size = sizeof(c), .flags = flags, .offset = offset,
		.buffer_bytes = buffer_bytes, .depth = depth,
	};

	if (flags & NVIO_STREAM_RANGES) {	/* 0.3's: not through the 0.2 call */
		if (err)
			*err = -EINVAL;
		return NULL;
	}
	return stream_make(f, &c, err);
}

nvio_stream_t *nvio_stream_open_config(nvio_file_t *f, const nvio_stream_config_t *c,
				       int *err)
{
	if (!c) {
		if (err)
			*err = -EINVAL;
		return NULL;
	}
	return stream_make(f, c, err);
}

/* ---- writer -------------------------------------------------------- */

/* Room left in the current buffer: a first buffer that starts unaligned
 * ends at an aligned offset, so every later one starts aligned. */
static uint64_t room(const struct nvio_stream *s, const struct sbuf *b)
{
	uint64_t cap = s->bufsz - b->off % s->unit;

	return cap - b->len;
}

/* Writes the current buffer asynchronously and moves to the next one. */
static int rotate(struct nvio_stream *s)
{
	struct sbuf *b = &s->bufs[s->cur], *nb;
	int r;

	if (b->len && (r = stream_op(s, b, b->mem, b->len, b->off)) < 0)
		return r;
	s->cur = (s->cur + 1) % s->nbuf;
	nb = &s->bufs[s->cur];
	if ((r = settle(s, nb)) < 0)
		return r;
	nb->off = s->pos;
	nb->len = 0;
	return 0;
}

/* A large write at an aligned position from memory O_DIRECT can take
 * goes straight from the caller's memory: this many bytes, else 0. */
static uint64_t direct_span(const struct nvio_stream *s, const void *buf, uint64_t n)
{
	const struct sbuf *b = &s->bufs[s->cur];

	if (b->len || n < s->bufsz || !s->f->align || s->pos % s->unit ||
	    (uintptr_t)buf % s->f->mem_align)
		return 0;
	return n / s->unit * s->unit;
}

/* Into a buffer: the driver copies into CUDA memory. */
static int copy_in(struct nvio_stream *s, void *dst, const void *src, uint64_t n)
{
	if (!s->dev_mem) {
		memcpy(dst, src, n);
		return 0;
	}
	return nvio_cuda_memcpy(dst, src, n);
}

/* Stream calls copy with memcpy: host memory only. */
static int host_memory(const void *buf)
{
	int dev;

	return nvio__cuda_pointer_device(buf, &dev) == 0;
}

int64_t nvio_stream_write(nvio_stream_t *s, const void *buf, uint64_t nbytes)
{
	const unsigned char *p = buf;
	uint64_t left = nbytes;
	int r;

	if (!s || !s->writer || (!buf && nbytes) || nbytes > INT64_MAX ||
	    (nbytes && !host_memory(buf)))
		return -EINVAL;
	if (nvio__forked(s->h))
		return -ECHILD;
	if (s->err)
		return nvio__error_publish(s->h, &s->rec);
	while (left > 0) {
		struct sbuf *b = &s->bufs[s->cur];
		uint64_t k = direct_span(s, p, left);

		if (k) {
			if ((r = stream_op(s, NULL, (void *)p, k, s->pos)) < 0)
				return r;
			b->off = s->pos + k;
		} else {
			k = room(s, b) < left ? room(s, b) : left;
			if ((r = copy_in(s, b->mem + b->len, p, k)) < 0)
				return fail(s, r, NULL);
			b->len += k;
		}
		p += k;
		left -= k;
		s->pos += k;
		if (room(s, &s->bufs[s->cur]) == 0 && (r = rotate(s)) < 0)
			return r;
	}
	return (int64_t)nbytes;
}

/* The bytes of b after its first k move to its start (less than a unit:
 * through the stack for CUDA memory). */
static int move_tail(struct nvio_stream *s, struct sbuf *b, uint64_t k)
{
	unsigned char tmp[NVIO__PAGE];
	uint64_t n = b->len - k;
	int r = 0;

	if (!s->dev_mem) {
		memmove(b->mem, b->mem + k, n);
		return 0;
	}
	for (uint64_t at = 0; at < n && !r; at += sizeof(tmp)) {
		uint64_t c = n - at < sizeof(tmp) ? n - at : sizeof(tmp);

		r = nvio_cuda_memcpy(tmp, b->mem + k + at, c);
		if (!r)
			r = nvio_cuda_memcpy(b->mem + at, tmp, c);
	}
	return r;
}

/*
 * Everything written so far but the unaligned last block goes to the
 * file: the aligned part of the current buffer is written, its tail
 * moves to the start of the buffer.
 */
static int writer_flush(struct nvio_stream *s)
{
	struct sbuf *b = &s->bufs[s->cur];
	uint64_t end = b->off + b->len, cut = end / s->unit * s->unit;
	int r;

	if (cut > b->off) {
		uint64_t k = cut - b->off;

		if ((r = stream_op(s, NULL, b->mem, k, b->off)) < 0)
			return r;
		if ((r = move_tail(s, b, k)) < 0)
			return fail(s, r, NULL);
		b->off = cut;
		b->len -= k;
	}
	return settle_all(s);
}

int nvio_stream_flush(nvio_stream_t *s)
{
	if (!s || !s->writer)
		return -EINVAL;
	if (nvio__forked(s->h))
		return -ECHILD;
	if (s->err)
		return nvio__error_publish(s->h, &s->rec);
	return writer_flush(s);
}

static int writer_close(struct nvio_stream *s, unsigned flags)
{
	struct sbuf *b = &s->bufs[s->cur];
	uint64_t size;
	int r = 0;

	if (!s->err && b->len)
		stream_op(s, b, b->mem, b->len, b->off);
	settle_all(s);
	if (s->err)
		return s->err;
	size = atomic_load(&s->f->size);
	/* a writer of ranges, or any writer of a joined file (SHARED without
	 * ATOMIC: a share, whose size is its creator's), leaves it alone */
	if (!s->ranges &&
	    (s->f->flags & (NVIO_FILE_SHARED | NVIO_FILE_ATOMIC)) != NVIO_FILE_SHARED &&
	    size != s->pos && size != UINT64_MAX &&
	    (r = nvio_file_truncate(s->f, s->pos)) < 0)
		return r;
	if ((flags & NVIO_STREAM_COMMIT) && (r = nvio_file_commit(s->f)) < 0)
		return r;
	if ((flags & NVIO_FSYNC) && !(flags & NVIO_STREAM_COMMIT))
		r = nvio_file_sync(s->f);
	return r;
}

/* ---- reader -------------------------------------------------------- */

/* The buffer whose window holds pos (in flight or ready), or NULL. */
static struct sbuf *window_at(struct nvio_stream *s, uint64_t pos)
{
	for (unsigned i = 0; i < s->nbuf; i++) {
		struct sbuf *b = &s->bufs[i];

		if (b->valid && pos >= b->off && pos < b->off + b->len)
			return b;
	}
	return NULL;
}

/* The window that holds offset off starts here. */
static uint64_t window_start(const struct nvio_stream *s, uint64_t off)
{
	return off / s->bufsz * s->bufsz;
}

/* Starts reading the window at off into a buffer no longer needed. */
static int issue(struct nvio_stream *s, uint64_t off)
{
	struct sbuf *b = NULL;
	uint64_t len;
	int r;

	if (off >= s->end || window_at(s, off))
		return 0;
	/* a buffer whose window lies outside the read-ahead range from pos
	 * (behind it, or far ahead after a seek back) */
	for (unsigned i = 0; i < s->nbuf && !b; i++) {
		struct sbuf *c = &s->bufs[i];
		uint64_t lo = window_start(s, s->pos), hi = lo + s->nbuf * s->bufsz;

		if (!c->valid || c->off + c->len <= s->pos || c->off >= hi)
			b = c;
	}
	if (!b)
		return 0;	/* every buffer holds something still ahead */
	if ((r = settle(s, b)) < 0)
		return r;
	len = s->end - off < s->bufsz ? s->end - off : s->bufsz;
	b->off = off;
	b->len = len;
	b->valid = 1;
	return stream_op(s, b, b->mem, len, off);
}

/* Keeps the windows from pos on in flight, as many as there are buffers. */
static int read_ahead(struct nvio_stream *s)
{
	uint64_t w = window_start(s, s->pos);
	int r = 0;

	for (unsigned i = 0; i < s->nbuf && !r; i++, w += s->bufsz)
		r = issue(s, w);
	return r;
}

int64_t nvio_stream_read(nvio_stream_t *s, void *buf, uint64_t nbytes)
{
	unsigned char *p = buf;
	uint64_t got = 0;
	int r;

	if (!s || s->writer || (!buf && nbytes) || nbytes > INT64_MAX ||
	    (nbytes && !host_memory(buf)))
		return -EINVAL;
	if (nvio__forked(s->h))
		return -ECHILD;
	if (s->err)
		return nvio__error_publish(s->h, &s->rec);
	while (got < nbytes && s->pos < s->end) {
		uint64_t want = nbytes - got, k;
		struct sbuf *b = window_at(s, s->pos);

		if (!b && want >= s->bufsz) {	/* straight into the caller's */
			k = s->end - s->pos < want ? s->end - s->pos : want;
			if ((r = stream_op(s, NULL, p, k, s->pos)) < 0)
				return r;
		} else {
			if (!b && ((r = issue(s, window_start(s, s->pos))) < 0 ||
				   !(b = window_at(s, s->pos))))
				return r < 0 ? r : fail(s, -EIO, NULL);
			if ((r = settle(s, b)) < 0)
				return r;
			k = b->off + b->len - s->pos;
			k = k < want ? k : want;
			memcpy(p, b->mem + (s->pos - b->off), k);
		}
		p += k;
		got += k;
		s->pos += k;
		if ((r = read_ahead(s)) < 0)
			return r;
	}
	return (int64_t)got;
}

/* A writer of ranges: what the buffer holds is written (async), the
 * next bytes go to offset. */
static int writer_seek(struct nvio_stream *s, uint64_t offset)
{
	struct sbuf *b = &s->bufs[s->cur];
	int r;

	if (offset == s->pos)
		return 0;
	if (b->len && (r = rotate(s)) < 0)
		return r;
	/*
	 * Back over bytes a buffer still writes (a range written again):
	 * that op ends first, or it could land after the new bytes (the
	 * other buffer's op, or a large write straight from the caller's
	 * memory) and undo them. Forward seeks keep both buffers busy.
	 */
	for (unsigned i = 0; i < s->nbuf; i++) {
		struct sbuf *o = &s->bufs[i];

		if (o->busy && offset < o->off + o->len && (r = settle(s, o)) < 0)
			return r;
	}
	s->pos = offset;
	b = &s->bufs[s->cur];
	b->off = offset;
	b->len = 0;
	return 0;
}

int nvio_stream_seek(nvio_stream_t *s, int64_t offset)
{
	if (!s || (s->writer && !s->ranges) || offset < 0)
		return -EINVAL;
	if (nvio__forked(s->h))
		return -ECHILD;
	if (s->err)
		return nvio__error_publish(s->h, &s->rec);
	if (s->writer)
		return writer_seek(s, (uint64_t)offset);
	s->pos = (uint64_t)offset;
	return 0;
}

int64_t nvio_stream_tell(const nvio_stream_t *s)
{
	return s ? (int64_t)s->pos : -EINVAL;
}

int nvio_stream_close(nvio_stream_t *s, unsigned flags)
{
	int r;

	if (!s)
		return 0;
	if (nvio__forked(s->h)) {	/* the parent's flushes never end here */
		free(s);	/* its buffers are the parent's memory, copied */
		return -ECHILD;
	}
	if (flags & ~(NVIO_FSYNC | NVIO_STREAM_COMMIT))
		return -EINVAL;	/* still open: nothing written is lost */
	if (s->writer)
		r = writer_close(s, flags);
	else
		r = flags ? -EINVAL : 0;
	settle_all(s);	/* nothing of ours may be in flight when freed */
	for (unsigned i = 0; i < s->nbuf && !s->caller_mem; i++)
		nvio_mem_free(s->bufs[i].mem);
	if (r == 0 && s->err)
		r = s->err;
	free(s);
	return r;
}

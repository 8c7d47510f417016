/*
 * opmem.c - an op's memory: its pieces and where their bytes live.
 *
 * An op's buffers, laid end to end, make its virtual buffer (struct
 * nvio__seg); its file ranges (struct nvio__extent) are cut into pieces
 * by plan.c. Submission (submit.c), the workers (workers.c) and the
 * op's end (op.c) all find bytes through these lookups, which call
 * nothing but plan.c and the staging copy, so none of those files
 * depends on another through them.
 */
#include "internal.h"

void nvio__op_piece(const struct nvio__op *op, uint64_t k, struct nvio__piece *pc)
{
	const struct nvio__extent *x = op->ext;
	uint32_t lo = 0, hi = op->next;

	while (hi - lo > 1) {	/* the last extent whose first <= k */
		uint32_t mid = lo + (hi - lo) / 2;

		if (op->ext[mid].first <= k)
			lo = mid;
		else
			hi = mid;
	}
	x = &op->ext[lo];
	nvio__plan_piece(&x->plan, k - x->first, &pc->off, &pc->len, &pc->body);
	pc->pos = x->pos + (pc->off - x->plan.off);
}

/* The buffer holding virtual position pos. */
static const struct nvio__seg *seg_at(const struct nvio__op *op, uint64_t pos)
{
	uint32_t lo = 0, hi = op->nsegs;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (op->segs[mid].pos <= pos)
			lo = mid;
		else
			hi = mid;
	}
	return &op->segs[lo];
}

unsigned char *nvio__op_at(const struct nvio__op *op, uint64_t pos, uint64_t *avail)
{
	const struct nvio__seg *s = op->nsegs == 1 ? op->segs : seg_at(op, pos);

	*avail = s->pos + s->len - pos;
	return s->base + (pos - s->pos);
}

unsigned char *nvio__op_mem(const struct nvio__op *op, uint64_t pos, uint64_t len)
{
	uint64_t avail;
	unsigned char *p = nvio__op_at(op, pos, &avail);

	return len <= avail ? p : NULL;
}

/* Calls fn on each part of [pos, pos + len) that lies in one buffer. */
static void each_part(const struct nvio__op *op, uint64_t pos, uint64_t len,
		      void (*fn)(unsigned char *mem, unsigned char *flat, size_t n),
		      unsigned char *flat)
{
	const struct nvio__seg *s = seg_at(op, pos);

	while (len > 0) {
		uint64_t in = pos - s->pos, n = s->len - in < len ? s->len - in : len;

		fn(s->base + in, flat, (size_t)n);
		flat += n;
		pos += n;
		len -= n;
		s++;
	}
}

static void to_flat(unsigned char *mem, unsigned char *flat, size_t n)
{
	nvio__stage_copy(flat, mem, n);
}

static void from_flat(unsigned char *mem, unsigned char *flat, size_t n)
{
	nvio__stage_copy(mem, flat, n);
}

void nvio__op_gather(const struct nvio__op *op, void *dst, uint64_t pos, uint64_t len)
{
	each_part(op, pos, len, to_flat, dst);
}

void nvio__op_scatter(const struct nvio__op *op, const void *src, uint64_t pos, uint64_t len)
{
	each_part(op, pos, len, from_flat, (unsigned char *)src);
}

/* ---- CRC-32 per buffer (nvio_op_t.crc32) ---------------------------- */

/* A copy is checksummed in steps this long: each step's source is still
 * in the cache when its CRC reads it again. At least STREAM_COPY_BYTES
 * (staging.c), so that the steps keep their non-temporal stores. */
#define CRC_STEP (64u << 10)

/*
 * The CRC of one part of piece k, which lies in buffer s at in, n bytes
 * long: a whole buffer's is final; a part of a buffer other pieces share
 * is kept as the piece's first or last part (only those two can be
 * partial) for nvio__op_crc_finish. Distinct pieces write distinct
 * places, so workers need no lock.
 */
static void crc_part(const struct nvio__op *op, uint64_t k, const struct nvio__seg *s,
		     uint64_t in, uint64_t n, int first, uint32_t crc)
{
	if (in == 0 && n == s->len)
		op->crc32[s->iov] = crc;
	else if (first)
		op->crc_parts[k].first = crc;
	else
		op->crc_parts[k].last = crc;
}

void nvio__op_crc(const struct nvio__op *op, uint64_t k, void *flat, uint64_t pos,
		  uint64_t len, int how)
{
	const struct nvio__seg *s = seg_at(op, pos);
	unsigned char *f = flat;

	for (int first = 1; len > 0; first = 0, s++) {
		uint64_t in = pos - s->pos, n = s->len - in < len ? s->len - in : len;
		unsigned char *mem = s->base + in;
		uint32_t crc = 0;

		if (how == NVIO__CRC_MEM || how == NVIO__CRC_FLAT) {
			crc = nvio_crc32(0, how == NVIO__CRC_MEM ? mem : f, (size_t)n);
		} else {
			for (uint64_t d = 0; d < n; d += CRC_STEP) {
				size_t m = (size_t)(n - d < CRC_STEP ? n - d : CRC_STEP);

				if (how == NVIO__CRC_GATHER) {
					nvio__stage_copy(f + d, mem + d, m);
					crc = nvio_crc32(crc, mem + d, m);
				} else {
					nvio__stage_copy(mem + d, f + d, m);
					crc = nvio_crc32(crc, f + d, m);
				}
			}
		}
		crc_part(op, k, s, in, n, first, crc);
		if (f)
			f += n;
		pos += n;
		len -= n;
	}
}

/* Joins part crc (n bytes at in) into buffer s's CRC: parts come in order. */
static void crc_join(const struct nvio__op *op, const struct nvio__seg *s, uint64_t in,
		     uint64_t n, uint32_t crc)
{
	uint32_t *c = &op->crc32[s->iov];

	*c = in == 0 ? crc : nvio_crc32_combine(*c, crc, n);
}

void nvio__op_crc_finish(struct nvio__op *op)
{
	for (uint64_t k = 0; k < op->npieces; k++) {
		struct nvio__piece pc;
		const struct nvio__seg *a, *b;
		uint64_t in, n;

		nvio__op_piece(op, k, &pc);
		if (!pc.len)
			continue;
		a = seg_at(op, pc.pos);
		b = seg_at(op, pc.pos + pc.len - 1);
		in = pc.pos - a->pos;
		n = a->len - in < pc.len ? a->len - in : pc.len;
		if (n < a->len)
			crc_join(op, a, in, n, op->crc_parts[k].first);
		if (b != a && pc.pos + pc.len - b->pos < b->len)
			crc_join(op, b, 0, pc.pos + pc.len - b->pos, op->crc_parts[k].last);
	}
}

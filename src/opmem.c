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

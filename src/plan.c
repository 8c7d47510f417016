/*
 * plan.c - cut one request into pieces.
 *
 * With direct I/O the range [off, off+len) becomes an unaligned head, an
 * aligned body and an unaligned tail. The body starts and ends on
 * multiples of `align`, which the caller chooses (submit.c plan_align:
 * the file's O_DIRECT alignment, at least the page for writes). The body
 * is cut into chunks of block size, itself rounded up to `align`. Without
 * direct I/O (align 0) the whole range is body.
 *
 * Pieces are numbered: head (if any), body chunks, tail (if any). An op
 * of several extents (a vector with its own offset per buffer) numbers
 * them across its extents in file order. Worker w of n gets a contiguous
 * run of them, so each worker streams through its own part of the file.
 */
#include "internal.h"

static uint64_t round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

void nvio__plan_make(struct nvio__plan *p, uint64_t off, uint64_t len,
		     uint64_t block, uint32_t align)
{
	uint64_t end = off + len;

	p->off = off;
	p->len = len;
	p->head = 0;
	p->tail = 0;
	p->body = len;
	p->chunk = block;
	if (align) {
		uint64_t a = align;
		uint64_t bstart = round_up(off, a);
		uint64_t bend = end / a * a;

		p->chunk = round_up(block, a);
		if (bstart < bend) {
			p->head = bstart - off;
			p->body = bend - bstart;
			p->tail = end - bend;
		} else {	/* no whole aligned unit: all head */
			p->head = len;
			p->body = 0;
		}
	}
	p->npieces = (p->head > 0) + (p->body + p->chunk - 1) / p->chunk +
		     (p->tail > 0);
}

void nvio__plan_piece(const struct nvio__plan *p, uint64_t k, uint64_t *off,
		      uint64_t *len, int *body)
{
	uint64_t nbody = (p->body + p->chunk - 1) / p->chunk;

	if (p->head) {
		if (k == 0) {
			*off = p->off;
			*len = p->head;
			*body = 0;
			return;
		}
		k--;
	}
	if (k < nbody) {
		uint64_t start = k * p->chunk;
		uint64_t left = p->body - start;

		*off = p->off + p->head + start;
		*len = left < p->chunk ? left : p->chunk;
		*body = 1;
		return;
	}
	*off = p->off + p->head + p->body;
	*len = p->tail;
	*body = 0;
}

/* npieces * w cannot overflow: a piece is at least one byte of a range
 * below INT64_MAX, and there are at most NVIO_MAX_PARALLELISM workers. */
void nvio__plan_slice(uint64_t npieces, unsigned w, unsigned n,
		      uint64_t *begin, uint64_t *end)
{
	*begin = npieces * w / n;
	*end = npieces * (w + 1) / n;
}

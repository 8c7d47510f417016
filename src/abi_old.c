/*
 * abi_old.c - the old ABIs of calls whose structs changed: 0.1's
 * nvio_error_t (changed in 0.2), 0.2's nvio_op_t and nvio_completion_t
 * (changed in 0.3).
 *
 * 0.2's nvio_error_t starts with struct_size and carries the op's tag;
 * a program linked against 0.1 passes the old layout, which it gets
 * from the NVIO_0.1 versions of nvio_last_error and nvio_format_error
 * (src/libnvio.map). Only libnvio.so has them (the Makefile defines
 * NVIO_SYMVER): a static link, or the Python extension, is always
 * against the header it was compiled with.
 */
#ifdef NVIO_SYMVER
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* nvio_error_t as 0.1 laid it out. */
struct error_v01 {
	int err;
	int is_write;
	uint64_t op_seq;
	int64_t offset;
	uint64_t nbytes;
	char what[32];
	char path[1024];
};

static void to_v01(const nvio_error_t *e, struct error_v01 *o)
{
	o->err = e->err;
	o->is_write = e->is_write;
	o->op_seq = e->op_seq;
	o->offset = e->offset;
	o->nbytes = e->nbytes;
	snprintf(o->what, sizeof(o->what), "%s", e->what);
	memcpy(o->path, e->path, sizeof(o->path));
}

NVIO_API int nvio__last_error_v01(const nvio_handle_t *h, struct error_v01 *out);
NVIO_API int nvio__format_error_v01(const struct error_v01 *e, char *buf, size_t len);

__asm__(".symver nvio__last_error_v01, nvio_last_error@NVIO_0.1");
__asm__(".symver nvio__format_error_v01, nvio_format_error@NVIO_0.1");

int nvio__last_error_v01(const nvio_handle_t *h, struct error_v01 *out)
{
	nvio_error_t e = { .struct_size = sizeof(e) };
	int r;

	if (!out)
		return -22;	/* EINVAL, as 0.1 returned */
	r = nvio_last_error(h, &e);
	if (r == 0 && e.err == 0 && !h)
		return r;
	to_v01(&e, out);
	return r;
}

int nvio__format_error_v01(const struct error_v01 *o, char *buf, size_t len)
{
	nvio_error_t e;

	if (!o)
		return nvio_format_error(NULL, buf, len);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	e.err = o->err;
	e.is_write = o->is_write;
	e.op_seq = o->op_seq;
	e.offset = o->offset;
	e.nbytes = o->nbytes;
	snprintf(e.what, sizeof(e.what), "%.*s", (int)sizeof(o->what), o->what);
	memcpy(e.path, o->path, sizeof(o->path));
	return nvio_format_error(&e, buf, len);
}
/*
 * 0.2's nvio_op_t and nvio_completion_t: the op had no reserved[] after
 * user_data; the completion no struct_size, flags after err_nbytes and a
 * 20-byte err_what. Programs linked against 0.2 call nvio_submit,
 * nvio_reap and nvio_completion_error at NVIO_0.2 and get these.
 */
struct op_v02 {
	uint32_t opcode;
	uint32_t flags;
	nvio_file_t *file;
	void *buf;
	uint64_t nbytes;
	int64_t offset;
	const nvio_iovec_t *iov;
	uint32_t iovcnt;
	uint32_t reserved0;
	uint64_t user_data;
};

struct completion_v02 {
	uint64_t user_data;
	int64_t res;
	uint64_t op_seq;
	int64_t err_offset;
	uint64_t err_nbytes;
	uint32_t flags;
	char err_what[20];
};

NVIO_API int nvio__submit_v02(nvio_handle_t *h, const struct op_v02 *ops, unsigned n);
NVIO_API int nvio__reap_v02(nvio_handle_t *h, struct completion_v02 *out, unsigned max,
			    unsigned min, int64_t timeout_ns);
NVIO_API int nvio__completion_error_v02(const struct completion_v02 *c, const char *path,
					nvio_error_t *out);

__asm__(".symver nvio__submit_v02, nvio_submit@NVIO_0.2");
__asm__(".symver nvio__reap_v02, nvio_reap@NVIO_0.2");
__asm__(".symver nvio__completion_error_v02, nvio_completion_error@NVIO_0.2");

static void op_from_v02(const struct op_v02 *o, nvio_op_t *n)
{
	memset(n, 0, sizeof(*n));
	n->opcode = o->opcode;
	n->flags = o->flags;
	n->file = o->file;
	n->buf = o->buf;
	n->nbytes = o->nbytes;
	n->offset = o->offset;
	n->iov = o->iov;
	n->iovcnt = o->iovcnt;
	n->reserved0 = o->reserved0;
	n->user_data = o->user_data;
}

static void completion_to_v02(const nvio_completion_t *c, struct completion_v02 *o)
{
	memset(o, 0, sizeof(*o));
	o->user_data = c->user_data;
	o->res = c->res;
	o->op_seq = c->op_seq;
	o->err_offset = c->err_offset;
	o->err_nbytes = c->err_nbytes;
	o->flags = c->flags;
	snprintf(o->err_what, sizeof(o->err_what), "%s", c->err_what);
}

int nvio__submit_v02(nvio_handle_t *h, const struct op_v02 *ops, unsigned n)
{
	unsigned i;

	if (!h || (n && !ops))
		return -22;
	for (i = 0; i < n; i++) {
		nvio_op_t op;
		int r;

		op_from_v02(&ops[i], &op);
		r = nvio__queue_submit(&h->q0, &op, 1);
		if (r < 0)
			return i > 0 ? (int)i : r;
	}
	return (int)i;
}

int nvio__reap_v02(nvio_handle_t *h, struct completion_v02 *out, unsigned max,
		   unsigned min, int64_t timeout_ns)
{
	nvio_completion_t c[64];
	unsigned n = 0, want;
	int r;

	if (!h || min > max || (max > 0 && !out))
		return -22;
	/* 64 at a time through the 0.3 layout: each batch waits for what
	 * min still asks (a min over 64 may wait up to once per batch) */
	do {
		unsigned need;

		want = max - n < 64 ? max - n : 64;
		need = n < min ? (min - n < want ? min - n : want) : 0;

		r = nvio_reap(h, c, want, need, need ? timeout_ns : 0);
		for (int i = 0; i < r; i++)
			completion_to_v02(&c[i], &out[n++]);
	} while (r == (int)want && n < max);
	return r < 0 && n == 0 ? r : (int)n;
}

int nvio__completion_error_v02(const struct completion_v02 *o, const char *path,
			       nvio_error_t *out)
{
	nvio_completion_t c;

	if (!o)
		return nvio_completion_error(NULL, path, out);
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	c.user_data = o->user_data;
	c.res = o->res;
	c.op_seq = o->op_seq;
	c.err_offset = o->err_offset;
	c.err_nbytes = o->err_nbytes;
	c.flags = o->flags;
	snprintf(c.err_what, sizeof(c.err_what), "%.*s", (int)sizeof(o->err_what),
		 o->err_what);
	return nvio_completion_error(&c, path, out);
}
#endif /* NVIO_SYMVER */

/*
 * compat.c - the 0.1 ABI of calls whose structs changed in 0.2.
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
#endif /* NVIO_SYMVER */

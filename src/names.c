/*
 * names.c - version, error texts and the names of engines and modes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "nvio.h"

unsigned nvio_version(void)
{
	return NVIO_VERSION_NUM;
}

#define STR2(x) #x
#define STR(x) STR2(x)

const char *nvio_version_string(void)
{
	return STR(NVIO_VERSION_MAJOR) "." STR(NVIO_VERSION_MINOR) "."
	       STR(NVIO_VERSION_PATCH);
}

const char *nvio_strerror(int err)
{
	switch (err) {
	case 0:
		return "Success";
	case -ENODATA:
		return "File ends before the requested range (read past end of file)";
	case -EOVERFLOW:
		return "File is larger than the buffer";
	case -EBADMSG:
		return "Validation failed: file and buffer differ";
	case -ECHILD:
		return "Handle made by the parent of this forked process: "
		       "make a new handle in this process";
	}
	if (err < 0 && err > -4096) {
		/* strerror() may share a buffer; these texts are constant. */
		const char *s = strerrordesc_np(-err);

		if (s)
			return s;
	}
	return "Unknown error";
}

static const char *const engine_names[NVIO_ENGINE_COUNT_] = {
	[NVIO_ENGINE_AUTO] = "auto",
	[NVIO_ENGINE_URING] = "io_uring",
	[NVIO_ENGINE_AIO] = "libaio",
	[NVIO_ENGINE_PSYNC] = "psync",
};

const char *nvio_engine_name(int engine)
{
	if (engine < 0 || engine >= NVIO_ENGINE_COUNT_)
		return NULL;
	return engine_names[engine];
}

int nvio_engine_from_name(const char *name)
{
	if (!name)
		return -EINVAL;
	for (int i = 0; i < NVIO_ENGINE_COUNT_; i++)
		if (!strcasecmp(name, engine_names[i]))
			return i;
	if (!strcasecmp(name, "uring"))
		return NVIO_ENGINE_URING;
	if (!strcasecmp(name, "aio"))
		return NVIO_ENGINE_AIO;
	return -EINVAL;
}

const char *nvio_direct_name(int direct)
{
	switch (direct) {
	case NVIO_DIRECT_AUTO:
		return "auto";
	case NVIO_DIRECT_ON:
		return "on";
	case NVIO_DIRECT_OFF:
		return "off";
	}
	return NULL;
}

int nvio_direct_from_name(const char *name)
{
	static const struct { const char *s; int v; } map[] = {
		{ "auto", NVIO_DIRECT_AUTO }, { "on", NVIO_DIRECT_ON },
		{ "1", NVIO_DIRECT_ON }, { "true", NVIO_DIRECT_ON },
		{ "yes", NVIO_DIRECT_ON }, { "off", NVIO_DIRECT_OFF },
		{ "0", NVIO_DIRECT_OFF }, { "false", NVIO_DIRECT_OFF },
		{ "no", NVIO_DIRECT_OFF },
	};

	for (size_t i = 0; name && i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcasecmp(name, map[i].s))
			return map[i].v;
	return -EINVAL;
}

/* 0.2 layout of nvio_error_t; the 0.1 one is in abi_old.c. */
#ifdef NVIO_SYMVER
__asm__(".symver nvio_format_error, nvio_format_error@@@NVIO_0.2");
#endif

int nvio_format_error(const nvio_error_t *theirs, char *buf, size_t len)
{
	nvio_error_t x, *e = &x;

	if (!theirs || theirs->struct_size < 8 || theirs->err == 0)
		return snprintf(buf, len, "no error");
	/* an older, smaller record has no later fields: they read as empty */
	memset(&x, 0, sizeof(x));
	memcpy(&x, theirs, theirs->struct_size < sizeof(x) ? theirs->struct_size :
	       sizeof(x));
	/* a step on a file as a whole (open, fsync, rename, ...) moves no bytes:
	 * a byte count and an offset would only mislead */
	if (e->what[0] && e->nbytes == 0 && e->offset == 0 &&
	    strcmp(e->what, "read") != 0 && strcmp(e->what, "write") != 0)
		return snprintf(buf, len, "%s of %s failed: %s", e->what,
				e->path[0] ? e->path : "?", nvio_strerror(e->err));
	return snprintf(buf, len,
			"%s of %" PRIu64 " bytes at offset %" PRId64
			" in %s failed: %s (op %" PRIu64 ")",
			e->what[0] ? e->what : (e->is_write ? "write" : "read"),
			e->nbytes, e->offset, e->path[0] ? e->path : "?",
			nvio_strerror(e->err), e->op_seq);
}

/*
 * test_config.c - nvio_config_init defaults, handle getters, invalid
 * configurations, environment overrides, names, version and strerror.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"

static void test_defaults(void)
{
	nvio_config_t c;

	t_ctx("config_init defaults");
	memset(&c, 0xab, sizeof(c));
	nvio_config_init(&c);
	T_EQ_U64(c.struct_size, sizeof(nvio_config_t));
	T_EQ_U64(c.flags, 0);
	T_EQ_U64(c.block_size, 1u << 20);
	T_EQ_U64(c.block_size, NVIO_DEFAULT_BLOCK_SIZE);
	T_EQ_U64(c.queue_depth, 128);
	T_EQ_U64(c.queue_depth, NVIO_DEFAULT_QUEUE_DEPTH);
	T_EQ_U64(c.intra_op_parallelism, 1);
	T_EQ_U64(c.single_submit, 0);
	T_EQ_U64(c.overlap_events, 0);
	T_EQ_INT(c.engine, NVIO_ENGINE_AUTO);
	T_EQ_INT(c.direct, NVIO_DIRECT_AUTO);
	T_EQ_U64(c.staging_bytes, 0);	/* automatic */
	for (int i = 0; i < 6; i++)
		T_EQ_U64(c.reserved[i], 0);
}

/* The getters and nvio_handle_config report what was asked for. */
static void test_getters(void)
{
	nvio_config_t c, got;
	nvio_handle_t *h = NULL;
	const char *note;

	t_ctx("getters");
	nvio_config_init(&c);
	c.block_size = 65536;
	c.queue_depth = 7;
	c.intra_op_parallelism = 3;
	c.single_submit = 1;
	c.overlap_events = 1;
	c.engine = NVIO_ENGINE_PSYNC;
	c.direct = NVIO_DIRECT_OFF;
	if (!T_OK(nvio_handle_create(&h, &c)))
		return;
	T_EQ_U64(nvio_get_block_size(h), 65536);
	T_EQ_U64(nvio_get_queue_depth(h), 7);
	T_EQ_U64(nvio_get_intra_op_parallelism(h), 3);
	T_EQ_INT(nvio_get_single_submit(h), 1);
	T_EQ_INT(nvio_get_overlap_events(h), 1);
	T_EQ_INT(nvio_get_engine(h), NVIO_ENGINE_PSYNC);
	T_EQ_INT(nvio_get_direct(h), NVIO_DIRECT_OFF);
	note = nvio_get_engine_note(h);
	T_TRUE(note != NULL && note[0] != 0);
	memset(&got, 0xcd, sizeof(got));
	got.struct_size = sizeof(got);
	if (T_OK(nvio_handle_config(h, &got))) {
		T_EQ_U64(got.struct_size, sizeof(nvio_config_t));
		T_EQ_U64(got.block_size, 65536);
		T_EQ_U64(got.queue_depth, 7);
		T_EQ_U64(got.intra_op_parallelism, 3);
		T_EQ_U64(got.single_submit, 1);
		T_EQ_U64(got.overlap_events, 1);
		T_EQ_INT(got.engine, NVIO_ENGINE_PSYNC);
		T_EQ_INT(got.direct, NVIO_DIRECT_OFF);
		/* automatic: block_size * queue_depth (under the 128 MiB cap) */
		T_EQ_U64(got.staging_bytes, 65536 * 7);
	}
	T_EQ_U64(nvio_pending(h), 0);
	nvio_handle_destroy(h);

	/* cfg NULL: the defaults, engine resolved. */
	t_ctx("getters, cfg NULL");
	h = NULL;
	if (!T_OK(nvio_handle_create(&h, NULL)))
		return;
	T_EQ_U64(nvio_get_block_size(h), NVIO_DEFAULT_BLOCK_SIZE);
	T_EQ_U64(nvio_get_queue_depth(h), NVIO_DEFAULT_QUEUE_DEPTH);
	T_EQ_U64(nvio_get_intra_op_parallelism(h), 1);
	T_EQ_INT(nvio_get_single_submit(h), 0);
	T_EQ_INT(nvio_get_overlap_events(h), 0);
	T_EQ_INT(nvio_get_direct(h), NVIO_DIRECT_AUTO);
	T_TRUE(nvio_get_engine(h) != NVIO_ENGINE_AUTO);
	got.struct_size = sizeof(got);
	if (T_OK(nvio_handle_config(h, &got))) {
		T_TRUE(got.engine != NVIO_ENGINE_AUTO);
		/* batch mode wants two queues of 1 MiB blocks: capped to
		 * one, so a staged batch is half a queue at the defaults */
		T_EQ_U64(got.staging_bytes, NVIO_MAX_AUTO_STAGING_BYTES);
	}
	note = nvio_get_engine_note(h);
	T_TRUE(note != NULL && note[0] != 0);
	nvio_handle_destroy(h);
	nvio_handle_destroy(NULL);

	/* Batch mode under the cap: a batch in flight, the next copied. */
	t_ctx("automatic staging, batch mode");
	nvio_config_init(&c);
	c.block_size = 65536;
	c.queue_depth = 7;
	h = NULL;
	got.struct_size = sizeof(got);
	if (T_OK(nvio_handle_create(&h, &c)) && T_OK(nvio_handle_config(h, &got)))
		T_EQ_U64(got.staging_bytes, 2 * 65536 * 7);
	nvio_handle_destroy(h);

	/* What is reported is the pool in force: two buffers at least
	 * (above the cap for big blocks), a buffer per slot at most. */
	{
		static const struct {
			uint64_t block, staging, want;
			uint32_t qd, overlap;
		} cs[] = {
			{ 256u << 20, 0, 512u << 20, 128, 0 },
			{ 65536, 1, 2 * 65536, 128, 0 },
			{ 65536, 3 * 65536 + 5, 3 * 65536, 128, 0 },
			{ 65536, 10 * 65536, 2 * 65536, 2, 1 },
		};

		for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
			t_ctx("staging: block %llu, asked %llu, qd %u",
			      (unsigned long long)cs[i].block,
			      (unsigned long long)cs[i].staging, cs[i].qd);
			nvio_config_init(&c);
			c.block_size = cs[i].block;
			c.staging_bytes = cs[i].staging;
			c.queue_depth = cs[i].qd;
			c.overlap_events = cs[i].overlap;
			h = NULL;
			got.struct_size = sizeof(got);
			if (T_OK(nvio_handle_create(&h, &c)) &&
			    T_OK(nvio_handle_config(h, &got)))
				T_EQ_U64(got.staging_bytes, cs[i].want);
			nvio_handle_destroy(h);
		}
	}
}

/* AUTO picks io_uring, else libaio, else psync: the first available. */
static void test_auto_order(void)
{
	static const int order[] = { NVIO_ENGINE_URING, NVIO_ENGINE_AIO,
				     NVIO_ENGINE_PSYNC };
	nvio_handle_t *h = NULL;
	int want = -1;

	t_ctx("auto engine order");
	for (int i = 0; i < 3 && want < 0; i++)
		if (nvio_engine_available(order[i], NULL, 0) == 1)
			want = order[i];
	T_EQ_INT(nvio_engine_available(NVIO_ENGINE_PSYNC, NULL, 0), 1);
	if (!T_OK(nvio_handle_create(&h, NULL)))
		return;
	T_EQ_INT(nvio_get_engine(h), want);
	nvio_handle_destroy(h);

	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++) {
		char why[256] = "";
		int r = nvio_engine_available(e, why, sizeof(why));

		t_ctx("engine_available(%s)", t_engine_str(e));
		T_TRUE(r == 0 || r == 1);
		if (r == 0)
			T_TRUE(why[0] != 0);
		if (r == 1) {
			h = NULL;
			T_OK(t_handle(&h, e, NVIO_DIRECT_AUTO, 1, 0));
			nvio_handle_destroy(h);
		}
	}
	t_ctx("engine_available(bad)");
	T_ERR(nvio_engine_available(99, NULL, 0), -EINVAL);
	T_ERR(nvio_engine_available(-1, NULL, 0), -EINVAL);
	T_ERR(nvio_engine_available(NVIO_ENGINE_COUNT_, NULL, 0), -EINVAL);
}

struct bad_cfg {
	const char *what;
	void (*set)(nvio_config_t *c);
};

static void b_block0(nvio_config_t *c) { c->block_size = 0; }
static void b_qd0(nvio_config_t *c) { c->queue_depth = 0; }
static void b_qdbig(nvio_config_t *c) { c->queue_depth = NVIO_MAX_QUEUE_DEPTH + 1; }
static void b_qdhuge(nvio_config_t *c) { c->queue_depth = UINT32_MAX; }
static void b_par0(nvio_config_t *c) { c->intra_op_parallelism = 0; }
static void b_parbig(nvio_config_t *c) { c->intra_op_parallelism = NVIO_MAX_PARALLELISM + 1; }
static void b_parhuge(nvio_config_t *c) { c->intra_op_parallelism = UINT32_MAX; }
static void b_eng_neg(nvio_config_t *c) { c->engine = -1; }
static void b_eng_count(nvio_config_t *c) { c->engine = NVIO_ENGINE_COUNT_; }
static void b_eng_99(nvio_config_t *c) { c->engine = 99; }
static void b_dir_neg(nvio_config_t *c) { c->direct = -1; }
static void b_dir_3(nvio_config_t *c) { c->direct = 3; }
static void b_flags1(nvio_config_t *c) { c->flags = 1u << 1; }
static void b_flagshi(nvio_config_t *c) { c->flags = 0x80000000u; }
static void b_res0(nvio_config_t *c) { c->reserved[0] = 1; }
static void b_res5(nvio_config_t *c) { c->reserved[5] = 1ull << 63; }
static void b_size0(nvio_config_t *c) { c->struct_size = 0; }
static void b_size7(nvio_config_t *c) { c->struct_size = 7; }
/* A newer caller's larger struct, with a field this library lacks set:
 * the struct lives inside a bigger buffer (see test_invalid). */
static void b_sizep8(nvio_config_t *c)
{
	c->struct_size = sizeof(*c) + 8;
	((unsigned char *)c)[sizeof(*c) + 3] = 1;
}

static const struct bad_cfg bad_cfgs[] = {
	{ "block_size 0", b_block0 },
	{ "queue_depth 0", b_qd0 },
	{ "queue_depth MAX+1", b_qdbig },
	{ "queue_depth UINT32_MAX", b_qdhuge },
	{ "parallelism 0", b_par0 },
	{ "parallelism MAX+1", b_parbig },
	{ "parallelism UINT32_MAX", b_parhuge },
	{ "engine -1", b_eng_neg },
	{ "engine COUNT_", b_eng_count },
	{ "engine 99", b_eng_99 },
	{ "direct -1", b_dir_neg },
	{ "direct 3", b_dir_3 },
	{ "flags 1<<1 (unknown)", b_flags1 },
	{ "flags high bit", b_flagshi },
	{ "reserved[0]", b_res0 },
	{ "reserved[5]", b_res5 },
	{ "struct_size 0", b_size0 },
	{ "struct_size 7", b_size7 },
	{ "struct_size sizeof+8, tail nonzero", b_sizep8 },
};

static void test_invalid(void)
{
	for (size_t i = 0; i < sizeof(bad_cfgs) / sizeof(bad_cfgs[0]); i++) {
		/* room for a newer, larger struct */
		union { nvio_config_t c; unsigned char b[sizeof(nvio_config_t) + 64]; } u;
		nvio_handle_t *h = NULL;
		int r;

		t_ctx("invalid config: %s", bad_cfgs[i].what);
		memset(&u, 0, sizeof(u));
		nvio_config_init(&u.c);
		u.c.engine = NVIO_ENGINE_PSYNC;
		bad_cfgs[i].set(&u.c);
		r = nvio_handle_create(&h, &u.c);
		T_ERR(r, -EINVAL);
		if (r == 0)
			nvio_handle_destroy(h);
	}
	/* The one known handle flag is accepted; without cuFile it does
	 * not route anything through cuFile. */
	{
		nvio_config_t c;
		nvio_handle_t *h = NULL;
		char why[256] = "";
		int mode = nvio_gds_mode(why, sizeof(why));

		t_ctx("NVIO_HANDLE_GDS");
		T_TRUE(mode == NVIO_CUFILE_NONE || mode == NVIO_CUFILE_DIRECT ||
		       mode == NVIO_CUFILE_COMPAT);
		if (mode == NVIO_CUFILE_NONE)
			T_TRUE(why[0] != 0);
		nvio_config_init(&c);
		c.engine = NVIO_ENGINE_PSYNC;
		c.flags = NVIO_HANDLE_GDS;
		if (T_OK(nvio_handle_create(&h, &c))) {
			if (mode == NVIO_CUFILE_NONE)
				T_EQ_INT(nvio_get_gds(h), 0);
			nvio_handle_destroy(h);
		}
	}
	t_ctx("invalid config: out NULL");
	T_ERR(nvio_handle_create(NULL, NULL), -EINVAL);

	/* The limits themselves are fine. */
	for (int k = 0; k < 2; k++) {
		nvio_config_t c;
		nvio_handle_t *h = NULL;

		t_ctx("limits: %s", k ? "max" : "min");
		nvio_config_init(&c);
		c.engine = NVIO_ENGINE_PSYNC;
		c.queue_depth = k ? NVIO_MAX_QUEUE_DEPTH : 1;
		c.intra_op_parallelism = k ? 16 : 1;
		if (T_OK(nvio_handle_create(&h, &c))) {
			T_EQ_U64(nvio_get_queue_depth(h), c.queue_depth);
			T_EQ_U64(nvio_get_intra_op_parallelism(h),
				 c.intra_op_parallelism);
			nvio_handle_destroy(h);
		}
	}
}

static void expect_env(const char *var, const char *val, int cfg_engine,
		       int want_err, int want_engine, int want_direct)
{
	nvio_config_t c;
	nvio_handle_t *h = NULL;
	int r;

	t_ctx("env %s=%s", var, val);
	setenv(var, val, 1);
	nvio_config_init(&c);
	c.engine = cfg_engine;
	c.direct = NVIO_DIRECT_ON;
	r = nvio_handle_create(&h, &c);
	unsetenv(var);
	if (!T_ERR(r, want_err) || r)
		return;
	if (want_engine >= 0)
		T_EQ_INT(nvio_get_engine(h), want_engine);
	if (want_direct >= 0)
		T_EQ_INT(nvio_get_direct(h), want_direct);
	nvio_handle_destroy(h);
}

/*
 * The environment supplies defaults only: it applies where the
 * configuration says AUTO, and an explicit engine or direct mode wins.
 */
static void test_env(void)
{
	int other = NVIO_ENGINE_PSYNC;

	if (nvio_engine_available(NVIO_ENGINE_URING, NULL, 0) == 1)
		other = NVIO_ENGINE_URING;
	else if (nvio_engine_available(NVIO_ENGINE_AIO, NULL, 0) == 1)
		other = NVIO_ENGINE_AIO;
	if (other == NVIO_ENGINE_PSYNC)
		t_note("only psync available: explicit-wins checked against psync");

	/* explicit engine: NVIO_ENGINE is not looked at, not even a bad one */
	expect_env("NVIO_ENGINE", "psync", other, 0, other, -1);
	expect_env("NVIO_ENGINE", "bogus", NVIO_ENGINE_PSYNC, 0, NVIO_ENGINE_PSYNC, -1);
	/* AUTO: NVIO_ENGINE decides */
	for (int e = NVIO_ENGINE_URING; e <= NVIO_ENGINE_PSYNC; e++) {
		if (nvio_engine_available(e, NULL, 0) != 1)
			continue;
		expect_env("NVIO_ENGINE", nvio_engine_name(e), NVIO_ENGINE_AUTO, 0, e, -1);
	}
	expect_env("NVIO_ENGINE", "bogus", NVIO_ENGINE_AUTO, -EINVAL, -1, -1);
	/* explicit direct (expect_env sets ON): NVIO_DIRECT is not looked at */
	expect_env("NVIO_DIRECT", "off", NVIO_ENGINE_PSYNC, 0, -1, NVIO_DIRECT_ON);
	expect_env("NVIO_DIRECT", "bogus", NVIO_ENGINE_PSYNC, 0, -1, NVIO_DIRECT_ON);

	/* AUTO direct: NVIO_DIRECT decides */
	for (int d = 0; d < 4; d++) {
		static const char *const vals[] = { "on", "off", "auto", "bogus" };
		static const int want[] = { NVIO_DIRECT_ON, NVIO_DIRECT_OFF,
					    NVIO_DIRECT_AUTO, -EINVAL };
		nvio_config_t c;
		nvio_handle_t *h = NULL;
		int r;

		t_ctx("env NVIO_DIRECT=%s over cfg auto", vals[d]);
		setenv("NVIO_DIRECT", vals[d], 1);
		nvio_config_init(&c);
		c.engine = NVIO_ENGINE_PSYNC;
		r = nvio_handle_create(&h, &c);
		unsetenv("NVIO_DIRECT");
		if (want[d] < 0) {
			T_ERR(r, want[d]);
		} else if (T_OK(r)) {
			T_EQ_INT(nvio_get_direct(h), want[d]);
		}
		if (r == 0)
			nvio_handle_destroy(h);
	}
}

/*
 * nvio_config_t grows: a struct that ends before a field (an older
 * caller's) gets the default for every field it lacks, whatever bytes
 * lie past its end; a larger one (a newer caller's) is accepted when the
 * bytes this library does not know are 0, else -EINVAL.
 */
static void test_struct_size(void)
{
	static const struct {
		const char *what;
		size_t size;
	} older[] = {
		{ "up to flags", offsetof(nvio_config_t, block_size) },
		{ "up to block_size", offsetof(nvio_config_t, queue_depth) },
		{ "up to queue_depth", offsetof(nvio_config_t,
						intra_op_parallelism) },
		{ "up to overlap_events", offsetof(nvio_config_t, engine) },
		{ "up to engine", offsetof(nvio_config_t, direct) },
		{ "up to direct", offsetof(nvio_config_t, staging_bytes) },
		{ "up to staging_bytes", offsetof(nvio_config_t, reserved) },
		{ "equal", sizeof(nvio_config_t) },
	};
	struct {
		nvio_config_t c;
		uint64_t tail[4];
	} big;
	nvio_config_t got;
	nvio_handle_t *h;

	for (size_t i = 0; i < sizeof(older) / sizeof(older[0]); i++) {
		size_t n = older[i].size;

		t_ctx("struct_size %zu (%s)", n, older[i].what);
		memset(&big, 0, sizeof(big));
		nvio_config_init(&big.c);
		big.c.struct_size = (uint32_t)n;
		big.c.block_size = 65536;
		big.c.queue_depth = 7;
		big.c.intra_op_parallelism = 2;
		big.c.single_submit = 1;
		big.c.overlap_events = 1;
		big.c.engine = NVIO_ENGINE_PSYNC;
		big.c.direct = NVIO_DIRECT_OFF;
		big.c.staging_bytes = 3 * 65536;
		/* what the caller does not know is garbage to it */
		memset((char *)&big + n, 0xff, sizeof(big) - n);
		h = NULL;
		if (!T_OK(nvio_handle_create(&h, &big.c)))
			continue;
#define FIELD_IN(f) (offsetof(nvio_config_t, f) + \
		     sizeof(((nvio_config_t *)0)->f) <= n)
		T_EQ_U64(nvio_get_block_size(h), FIELD_IN(block_size) ? 65536 :
			 NVIO_DEFAULT_BLOCK_SIZE);
		T_EQ_U64(nvio_get_queue_depth(h), FIELD_IN(queue_depth) ? 7 :
			 NVIO_DEFAULT_QUEUE_DEPTH);
		T_EQ_U64(nvio_get_intra_op_parallelism(h),
			 FIELD_IN(intra_op_parallelism) ? 2 : 1);
		T_EQ_INT(nvio_get_single_submit(h),
			 FIELD_IN(single_submit) ? 1 : 0);
		T_EQ_INT(nvio_get_overlap_events(h),
			 FIELD_IN(overlap_events) ? 1 : 0);
		if (FIELD_IN(engine))
			T_EQ_INT(nvio_get_engine(h), NVIO_ENGINE_PSYNC);
		T_EQ_INT(nvio_get_direct(h), FIELD_IN(direct) ?
			 NVIO_DIRECT_OFF : NVIO_DIRECT_AUTO);
		T_EQ_INT(nvio_get_gds(h), 0);	/* flags: 0 */
		memset(&got, 0, sizeof(got));
		got.struct_size = sizeof(got);
		if (FIELD_IN(staging_bytes) &&
		    T_OK(nvio_handle_config(h, &got)))
			T_EQ_U64(got.staging_bytes, 3 * 65536);
		/* an older caller's smaller struct: filled up to its size */
		{
			union { nvio_config_t c; unsigned char b[sizeof(nvio_config_t)]; } u;

			memset(&u, 0xab, sizeof(u));
			u.c.struct_size = offsetof(nvio_config_t, engine);
			if (T_OK(nvio_handle_config(h, &u.c))) {
				T_EQ_U64(u.c.struct_size, offsetof(nvio_config_t, engine));
				T_EQ_U64(u.c.block_size, nvio_get_block_size(h));
				T_EQ_INT(u.b[offsetof(nvio_config_t, engine)], 0xab);
			}
		}
#undef FIELD_IN
		nvio_handle_destroy(h);
	}

	for (int k = 0; k < 5; k++) {
		int bad = k >= 2;

		t_ctx("struct_size %zu, tail %s", sizeof(big),
		      bad ? "nonzero" : "zero");
		memset(&big, 0, sizeof(big));
		nvio_config_init(&big.c);
		big.c.struct_size = (uint32_t)(k == 1 ? sizeof(big.c) + 8 :
					       sizeof(big));
		big.c.engine = NVIO_ENGINE_PSYNC;
		big.c.block_size = 65536;
		if (bad)
			((unsigned char *)big.tail)[k == 2 ? 0 : k == 3 ? 17 :
						    sizeof(big.tail) - 1] = 1;
		h = NULL;
		if (bad) {
			T_ERR(nvio_handle_create(&h, &big.c), -EINVAL);
		} else if (T_OK(nvio_handle_create(&h, &big.c))) {
			T_EQ_U64(nvio_get_block_size(h), 65536);
			T_EQ_INT(nvio_get_engine(h), NVIO_ENGINE_PSYNC);
		}
		nvio_handle_destroy(h);
	}
	/* a byte past a smaller struct_size is never looked at */
	t_ctx("struct_size sizeof + 8, nonzero byte past it");
	memset(&big, 0, sizeof(big));
	nvio_config_init(&big.c);
	big.c.struct_size = (uint32_t)(sizeof(big.c) + 8);
	big.c.engine = NVIO_ENGINE_PSYNC;
	big.tail[1] = ~0ull;
	h = NULL;
	T_OK(nvio_handle_create(&h, &big.c));
	nvio_handle_destroy(h);
}

/*
 * nvio_error_t: nvio_last_error fills exactly struct_size bytes (an older
 * caller's smaller struct gets the fields it has, the bytes after it are
 * not written); below 8 is -EINVAL.
 */
static void test_error_struct_size(void)
{
	union {
		nvio_error_t e;
		unsigned char b[sizeof(nvio_error_t) + 64];
	} u;
	static const size_t sizes[] = {
		8, offsetof(nvio_error_t, op_seq),
		offsetof(nvio_error_t, user_data),
		offsetof(nvio_error_t, what) + 5,
		offsetof(nvio_error_t, path),
	};
	char path[T_PATH_MAX], buf[16];
	nvio_handle_t *h = NULL;

	t_ctx("nvio_error_t struct_size");
	t_path(path, "no-such-file");
	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 1, 0))
		return;
	T_ERR(nvio_pread(h, buf, sizeof(buf), path, 0, 0), -ENOENT);
	/* the full struct */
	memset(&u, 0xa5, sizeof(u));
	u.e.struct_size = sizeof(nvio_error_t);
	if (T_ERR(nvio_last_error(h, &u.e), -ENOENT)) {
		T_EQ_U64(u.e.struct_size, sizeof(nvio_error_t));
		T_ERR(u.e.err, -ENOENT);
		T_EQ_INT(u.e.is_write, 0);
		T_EQ_U64(u.e.user_data, 0);
		T_TRUE(strstr(u.e.path, "no-such-file") != NULL);
		for (size_t i = sizeof(nvio_error_t); i < sizeof(u); i++)
			if (u.b[i] != 0xa5) {
				T_FAILF("byte %zu past the struct written", i);
				break;
			}
	}
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		t_ctx("nvio_error_t struct_size %zu", sizes[k]);
		memset(&u, 0xa5, sizeof(u));
		u.e.struct_size = (uint32_t)sizes[k];
		T_ERR(nvio_last_error(h, &u.e), -ENOENT);
		T_EQ_U64(u.e.struct_size, sizes[k]);
		T_ERR(u.e.err, -ENOENT);
		for (size_t i = sizes[k]; i < sizeof(u); i++)
			if (u.b[i] != 0xa5) {
				T_FAILF("byte %zu written past struct_size %zu",
					i, sizes[k]);
				break;
			}
	}
	for (uint32_t n = 0; n < 8; n++) {
		t_ctx("nvio_error_t struct_size %u", n);
		memset(&u, 0xa5, sizeof(u));
		u.e.struct_size = n;
		T_ERR(nvio_last_error(h, &u.e), -EINVAL);
		for (size_t i = 4; i < sizeof(u); i++)
			if (u.b[i] != 0xa5) {
				T_FAILF("byte %zu written", i);
				break;
			}
	}
	t_ctx("nvio_error_t NULL");
	T_ERR(nvio_last_error(h, NULL), -EINVAL);
	nvio_handle_destroy(h);
}

static void test_names(void)
{
	static const char *const enames[] = { "auto", "io_uring", "libaio",
					      "psync" };

	t_ctx("engine names");
	for (int e = 0; e < NVIO_ENGINE_COUNT_; e++) {
		const char *n = nvio_engine_name(e);

		if (!T_TRUE(n != NULL))
			continue;
		if (strcmp(n, enames[e]))
			T_FAILF("nvio_engine_name(%d) = \"%s\", expected \"%s\"",
				e, n, enames[e]);
		T_EQ_INT(nvio_engine_from_name(n), e);
	}
	T_TRUE(nvio_engine_name(-1) == NULL);
	T_TRUE(nvio_engine_name(NVIO_ENGINE_COUNT_) == NULL);
	T_EQ_INT(nvio_engine_from_name("uring"), NVIO_ENGINE_URING);
	T_EQ_INT(nvio_engine_from_name("aio"), NVIO_ENGINE_AIO);
	T_ERR(nvio_engine_from_name("bogus"), -EINVAL);
	T_ERR(nvio_engine_from_name(""), -EINVAL);
	T_ERR(nvio_engine_from_name(NULL), -EINVAL);

	t_ctx("direct names");
	for (int d = 0; d < 3; d++) {
		const char *n = nvio_direct_name(d);

		if (T_TRUE(n != NULL))
			T_EQ_INT(nvio_direct_from_name(n), d);
	}
	T_TRUE(nvio_direct_name(3) == NULL);
	T_TRUE(nvio_direct_name(-1) == NULL);
	T_EQ_INT(nvio_direct_from_name("auto"), NVIO_DIRECT_AUTO);
	T_EQ_INT(nvio_direct_from_name("on"), NVIO_DIRECT_ON);
	T_EQ_INT(nvio_direct_from_name("off"), NVIO_DIRECT_OFF);
	T_EQ_INT(nvio_direct_from_name("1"), NVIO_DIRECT_ON);
	T_EQ_INT(nvio_direct_from_name("0"), NVIO_DIRECT_OFF);
	T_ERR(nvio_direct_from_name("maybe"), -EINVAL);
	T_ERR(nvio_direct_from_name(NULL), -EINVAL);
}

static void test_version(void)
{
	char want[32];
	const char *s = nvio_version_string();

	t_ctx("version");
	T_EQ_U64(nvio_version(), NVIO_VERSION_NUM);
	T_EQ_U64(NVIO_VERSION_NUM, (0u << 16) | (3u << 8) | 1u);
	T_TRUE(NVIO_CHECK_VERSION(0, 3, 1));
	T_TRUE(NVIO_CHECK_VERSION(0, 2, 9));
	T_TRUE(!NVIO_CHECK_VERSION(0, 3, 2));
	T_TRUE(!NVIO_CHECK_VERSION(1, 0, 0));
	snprintf(want, sizeof(want), "%d.%d.%d", NVIO_VERSION_MAJOR,
		 NVIO_VERSION_MINOR, NVIO_VERSION_PATCH);
	if (T_TRUE(s != NULL) && strcmp(s, want))
		T_FAILF("nvio_version_string() = \"%s\", expected \"%s\"", s,
			want);
}

static void test_strerror(void)
{
	static const int errs[] = { -ENODATA, -EBADMSG, -EOVERFLOW, -EIO,
				    -ENOSPC, -EINVAL, 0, -99999, 12345,
				    INT32_MIN, -1 };
	const char *a, *b;

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		const char *s = nvio_strerror(errs[i]);

		t_ctx("strerror(%d)", errs[i]);
		T_TRUE(s != NULL && s[0] != 0);
	}
	t_ctx("strerror distinct");
	a = nvio_strerror(-ENODATA);
	b = nvio_strerror(-EBADMSG);
	if (a && b)
		T_TRUE(strcmp(a, b) != 0);
	a = nvio_strerror(-EIO);
	b = nvio_strerror(-ENOSPC);
	if (a && b)
		T_TRUE(strcmp(a, b) != 0);
}

int main(void)
{
	t_init("config");
	test_defaults();
	test_getters();
	test_auto_order();
	test_invalid();
	test_env();
	test_struct_size();
	test_error_struct_size();
	test_names();
	test_version();
	test_strerror();
	return t_done();
}

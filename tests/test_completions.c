/*
 * test_completions.c - tagged ops (nvio_submit) and their completions
 * (nvio_reap): every accepted op comes back exactly once with its tag and
 * its bytes or error; failures inside a batch (a file shrunk behind nvio's
 * back, injected -EIO) are reported per op with the failing piece; the
 * refused-at-submit rule; reap's min/max/timeout; the completion fd's
 * readiness; nvio_inflight; nvio_wait ignoring tagged ops; threads that
 * submit while one reaps; nvio_completion_error. Every engine, direct on
 * and off. Bytes are checked with libc.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define BS (64u << 10)
#define FSIZE (4u << 20)
#define MAXOPS 128
#define SEC 1000000000ll

static unsigned char *file_bytes, *mem;
static uint64_t seed = 9000;

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

/*
 * Reaps until n completions have come (10 s without one is a failure);
 * returns how many came. out must hold n.
 */
static int reap_n(nvio_handle_t *h, nvio_completion_t *out, int n)
{
	int got = 0;

	while (got < n) {
		int k = nvio_reap(h, out + got, (unsigned)(n - got), 1, 10 * SEC);

		if (k < 0) {
			T_FAILF("nvio_reap: %s", t_errname(k));
			break;
		}
		if (k == 0) {
			T_FAILF("nvio_reap: nothing in 10 s, %d of %d came",
				got, n);
			break;
		}
		got += k;
	}
	return got;
}

/* Op i: an odd-sized range of its own, in the file and in memory; tag
 * 1000 + 7 * i. */
static void make_ops(nvio_op_t *ops, int n, nvio_file_t *f, uint32_t opcode)
{
	memset(ops, 0, sizeof(*ops) * (size_t)n);
	for (int i = 0; i < n; i++) {
		uint64_t sz = 1 + (uint64_t)(i * 7919) % 30000;
		int64_t off = (int64_t)i * 30011 + (i % 3);

		ops[i].opcode = opcode;
		ops[i].file = f;
		ops[i].buf = mem + (uint64_t)i * 50016 + (uint64_t)(i % 5);
		ops[i].nbytes = sz;
		ops[i].offset = off;
		ops[i].user_data = 1000 + 7 * (uint64_t)i;
	}
}

static int op_index(uint64_t tag, int n)
{
	uint64_t k = tag - 1000;

	if (tag < 1000 || k % 7 || k / 7 >= (uint64_t)n)
		return -1;
	return (int)(k / 7);
}

/* N reads and N writes with tags: each back once, with its bytes. */
static void test_tags(nvio_handle_t *h, const char *path)
{
	const int n = t_quick() ? 24 : MAXOPS;
	nvio_op_t ops[MAXOPS];
	nvio_completion_t c[MAXOPS];
	int seen[MAXOPS], k;
	nvio_file_t *f;

	t_ctx("%s %d tagged reads", t_combo(), n);
	t_fill_random(file_bytes, FSIZE, seed++);
	if (!T_OK(t_write_file(path, file_bytes, FSIZE)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	if (!f)
		return;
	make_ops(ops, n, f, NVIO_OP_READ);
	T_EQ_INT(nvio_submit(h, ops, (unsigned)n), n);
	T_EQ_U64(nvio_inflight(h), n);
	T_EQ_U64(nvio_pending(h), 0);
	/* nvio_wait reports no tagged op */
	T_EQ_INT(nvio_wait(h), 0);
	k = reap_n(h, c, n);
	T_EQ_INT(k, n);
	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < k; i++) {
		int j = op_index(c[i].user_data, n);

		if (!T_TRUE(j >= 0)) {
			T_FAILF("unknown tag %llu",
				(unsigned long long)c[i].user_data);
			continue;
		}
		if (!T_EQ_INT(seen[j], 0))
			continue;
		seen[j] = 1;
		T_EQ_INT(c[i].res, (int64_t)ops[j].nbytes);
		T_EQ_U64(c[i].flags & NVIO_COMPLETION_WRITE, 0);
		T_MEM_EQ((unsigned char *)ops[j].buf,
			 file_bytes + ops[j].offset, ops[j].nbytes);
	}
	T_EQ_U64(nvio_inflight(h), 0);
	T_EQ_INT(nvio_reap(h, c, MAXOPS, 0, 0), 0);

	t_ctx("%s %d tagged writes", t_combo(), n);
	make_ops(ops, n, f, NVIO_OP_WRITE);
	for (int i = 0; i < n; i++) {
		t_fill_random(ops[i].buf, ops[i].nbytes, seed++);
		memcpy(file_bytes + ops[i].offset, ops[i].buf, ops[i].nbytes);
	}
	/* in two batches; reaped in small bites */
	T_EQ_INT(nvio_submit(h, ops, (unsigned)n / 2), n / 2);
	T_EQ_INT(nvio_submit(h, ops + n / 2, (unsigned)(n - n / 2)),
		 n - n / 2);
	memset(seen, 0, sizeof(seen));
	for (int got = 0; got < n;) {
		k = nvio_reap(h, c, 5, 1, 10 * SEC);
		if (!T_TRUE(k > 0 && k <= 5))
			break;
		for (int i = 0; i < k; i++) {
			int j = op_index(c[i].user_data, n);

			if (!T_TRUE(j >= 0) || !T_EQ_INT(seen[j], 0))
				continue;
			seen[j] = 1;
			T_EQ_INT(c[i].res, (int64_t)ops[j].nbytes);
			T_EQ_U64(c[i].flags & NVIO_COMPLETION_WRITE,
				 NVIO_COMPLETION_WRITE);
		}
		got += k;
		T_EQ_U64(nvio_inflight(h), n - got);
	}
	nvio_file_close(f);
	{
		size_t sz = 0;
		unsigned char *chk = t_alloc(FSIZE + 1);

		if (T_OK(t_read_file(path, chk, FSIZE + 1, &sz)) &&
		    T_EQ_U64(sz, FSIZE))
			T_MEM_EQ(chk, file_bytes, FSIZE);
		free(chk);
	}
}

/* ---- failures inside a batch ---- */

static _Atomic int64_t fault_at = -1;	/* reads covering it fail: -EIO */

static ssize_t eio_at(int is_write, int fd, uint64_t off, size_t n,
		      ssize_t res)
{
	int64_t at = atomic_load(&fault_at);

	if (!is_write && at >= 0 && (uint64_t)at >= off &&
	    (uint64_t)at < off + n)
		return -EIO;
	return res;
}

static void test_partial(nvio_handle_t *h, const char *path)
{
	const int n = 12;
	nvio_op_t ops[12];
	nvio_completion_t c[12];
	int seen[12] = { 0 }, k;
	nvio_file_t *f;
	int64_t fault;

	/* Ops 1, 4, 7, 10 read past the end of a file shrunk behind nvio's
	 * back: accepted (nvio knows the old size), they end -ENODATA. */
	t_ctx("%s batch, file shrunk meanwhile", t_combo());
	t_fill_random(file_bytes, FSIZE, seed++);
	if (!T_OK(t_write_file(path, file_bytes, 1u << 20)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (!f)
		return;
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < n; i++) {
		ops[i].opcode = NVIO_OP_READ;
		ops[i].file = f;
		ops[i].buf = mem + (uint64_t)i * 70000;
		ops[i].nbytes = 60000 + (uint64_t)i;
		ops[i].offset = i % 3 == 1 ? 700001 + (int64_t)i * 100 :
				(int64_t)i * 1001;
		ops[i].user_data = (uint64_t)i << 40;
	}
	T_OK(truncate(path, 600000));
	T_EQ_INT(nvio_submit(h, ops, (unsigned)n), n);
	k = reap_n(h, c, n);
	for (int i = 0; i < k; i++) {
		uint64_t j = c[i].user_data >> 40;

		if (!T_TRUE(j < (uint64_t)n) || !T_EQ_INT(seen[j], 0))
			continue;
		seen[j] = 1;
		t_ctx("%s batch, file shrunk meanwhile: op %d", t_combo(),
		      (int)j);
		if (j % 3 == 1) {
			T_ERR(c[i].res, -ENODATA);
			T_TRUE(c[i].err_what[0] != 0);
			T_TRUE(c[i].err_offset >= ops[j].offset &&
			       c[i].err_offset < ops[j].offset +
			       (int64_t)ops[j].nbytes);
		} else {
			T_EQ_INT(c[i].res, (int64_t)ops[j].nbytes);
			T_MEM_EQ((unsigned char *)ops[j].buf,
				 file_bytes + ops[j].offset, ops[j].nbytes);
		}
	}
	nvio_file_close(f);

	/* Ops whose range covers `fault` fail with -EIO, each reported
	 * with a piece that covers it; the others move their bytes. */
	t_ctx("%s batch, injected -EIO", t_combo());
	if (!T_OK(t_write_file(path, file_bytes, FSIZE)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (!f)
		return;
	fault = 3 * 200000 + 12345;
	for (int i = 0; i < n; i++) {
		/* op i covers [i * 200000, + 150000); op 3 has the fault,
		 * and so does op 9 (a second range over it) */
		ops[i].offset = i == 9 ? fault - 5 : (int64_t)i * 200000;
		ops[i].nbytes = 150000;
		ops[i].buf = mem + (uint64_t)i * 160000;
		ops[i].file = f;	/* the first round's file is closed */
	}
	atomic_store(&fault_at, fault);
	nvio__sys.io_result = eio_at;
	T_EQ_INT(nvio_submit(h, ops, (unsigned)n), n);
	k = reap_n(h, c, n);
	nvio__sys_reset();
	atomic_store(&fault_at, -1);
	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < k; i++) {
		uint64_t j = c[i].user_data >> 40;

		if (!T_TRUE(j < (uint64_t)n) || !T_EQ_INT(seen[j], 0))
			continue;
		seen[j] = 1;
		t_ctx("%s batch, injected -EIO: op %d", t_combo(), (int)j);
		if (j == 3 || j == 9) {
			nvio_error_t e;
			char line[2048];

			T_ERR(c[i].res, -EIO);
			T_TRUE(c[i].err_offset <= fault &&
			       fault < c[i].err_offset + (int64_t)c[i].err_nbytes);
			T_TRUE(strcmp(c[i].err_what, "pread") == 0 ||
			       strcmp(c[i].err_what, "read") == 0);
			T_EQ_U64(c[i].flags & NVIO_COMPLETION_WRITE, 0);
			/* the full record, and its line names the path */
			memset(&e, 0, sizeof(e));
			e.struct_size = sizeof(e);
			T_ERR(nvio_completion_error(&c[i], nvio_file_path(f),
						    &e), -EIO);
			T_ERR(e.err, -EIO);
			T_EQ_INT(e.is_write, 0);
			T_EQ_U64(e.op_seq, c[i].op_seq);
			T_EQ_U64(e.offset, c[i].err_offset);
			T_EQ_U64(e.nbytes, c[i].err_nbytes);
			T_EQ_U64(e.user_data, c[i].user_data);
			T_TRUE(strcmp(e.what, c[i].err_what) == 0);
			T_TRUE(strcmp(e.path, path) == 0);
			if (T_TRUE(nvio_format_error(&e, line, sizeof(line)) > 0) &&
			    !strstr(line, path))
				T_FAILF("format_error line without the path: %s",
					line);
		} else {
			T_EQ_INT(c[i].res, (int64_t)ops[j].nbytes);
			T_MEM_EQ((unsigned char *)ops[j].buf,
				 file_bytes + ops[j].offset, ops[j].nbytes);
		}
	}
	for (int j = 0; j < n; j++)
		T_EQ_INT(seen[j], 1);
	nvio_file_close(f);
}

/* ---- refused at submit ---- */

static void test_refused(nvio_handle_t *h, const char *path)
{
	nvio_op_t ops[4], bad, pair[2];
	nvio_completion_t c[4];
	nvio_error_t e;
	nvio_file_t *f, *ro;
	int k;

	t_ctx("%s refused at submit", t_combo());
	t_fill_random(file_bytes, 100000, seed++);
	if (!T_OK(t_write_file(path, file_bytes, 100000)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	ro = t_open_file(h, path, NVIO_FILE_READ);
	if (!f || !ro)
		goto out;
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 4; i++) {
		ops[i].opcode = NVIO_OP_READ;
		ops[i].file = f;
		ops[i].buf = mem + (uint64_t)i * 20000;
		ops[i].nbytes = 10000;
		ops[i].offset = (int64_t)i * 10000;
		ops[i].user_data = 500 + (uint64_t)i;
	}
	ops[2].offset = 95000;	/* past the end: refused, -ENODATA */
	T_EQ_INT(nvio_submit(h, ops, 4), 2);
	T_ERR(nvio_submit(h, ops + 2, 2), -ENODATA);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -ENODATA);
	T_EQ_U64(e.user_data, 502);
	T_EQ_U64(nvio_inflight(h), 2);
	k = reap_n(h, c, 2);
	for (int i = 0; i < k; i++) {
		T_TRUE(c[i].user_data == 500 || c[i].user_data == 501);
		T_EQ_INT(c[i].res, 10000);
	}
	/* a refused op never completes */
	T_EQ_INT(nvio_reap(h, c, 4, 1, 50 * 1000 * 1000), 0);
	T_EQ_U64(nvio_inflight(h), 0);

	/* one invalid field at a time: -EINVAL (or the errno named) */
	{
		static const struct {
			const char *what;
			int err;
		} cases[] = {
			{ "opcode 0", -EINVAL }, { "opcode 3", -EINVAL },
			{ "unknown flag", -EINVAL }, { "reserved0", -EINVAL },
			{ "file NULL", -EINVAL }, { "buf NULL", -EINVAL },
			{ "negative offset", -EINVAL },
			{ "offset + nbytes past INT64_MAX", -EINVAL },
			{ "buf and iov", -EINVAL },
			{ "write to a read-only file", -EBADF },
		};
		nvio_iovec_t iov = { mem, 10, 0 };

		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			t_ctx("%s refused: %s", t_combo(), cases[i].what);
			bad = ops[0];
			switch (i) {
			case 0: bad.opcode = 0; break;
			case 1: bad.opcode = 3; break;
			case 2: bad.flags = 1u << 20; break;
			case 3: bad.reserved0 = 1; break;
			case 4: bad.file = NULL; break;
			case 5: bad.buf = NULL; break;
			case 6: bad.offset = -4096; break;
			case 7: bad.offset = INT64_MAX - 10; break;
			case 8: bad.iov = &iov; bad.iovcnt = 1; break;
			case 9: bad.file = ro; bad.opcode = NVIO_OP_WRITE; break;
			}
			T_ERR(nvio_submit(h, &bad, 1), cases[i].err);
			/* behind a good op: that one accepted, 1 returned */
			pair[0] = ops[1];
			pair[1] = bad;
			T_EQ_INT(nvio_submit(h, pair, 2), 1);
			T_EQ_INT(reap_n(h, c, 1), 1);
			T_EQ_U64(c[0].user_data, 501);
			T_EQ_U64(nvio_inflight(h), 0);
		}
	}
	t_ctx("%s submit of nothing", t_combo());
	T_EQ_INT(nvio_submit(h, ops, 0), 0);
	T_ERR(nvio_submit(h, NULL, 1), -EINVAL);
	T_ERR(nvio_submit(NULL, ops, 1), -EINVAL);
	T_EQ_INT(nvio_reap(h, c, 4, 0, 0), 0);
out:
	nvio_file_close(f);
	nvio_file_close(ro);
}

/* ---- reap's limits and timeouts; the completion fd ---- */

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r = poll(&p, 1, ms);

	return r > 0 && (p.revents & POLLIN);
}

static void test_reap_and_fd(nvio_handle_t *h, const char *path)
{
	nvio_completion_t c[16];
	nvio_op_t ops[8];
	nvio_file_t *f;
	int64_t t0, dt;
	int fd, k;

	t_ctx("%s reap arguments", t_combo());
	T_ERR(nvio_reap(h, c, 2, 3, 0), -EINVAL);	/* min > max */
	T_ERR(nvio_reap(NULL, c, 2, 0, 0), -EINVAL);
	t0 = now_ns();
	T_EQ_INT(nvio_reap(h, c, 16, 0, 0), 0);
	T_EQ_INT(nvio_reap(h, c, 16, 1, 0), 0);	/* timeout 0: no wait */
	dt = now_ns() - t0;
	T_TRUE(dt < 1 * SEC);
	t_ctx("%s reap timeout 50 ms, nothing in flight", t_combo());
	t0 = now_ns();
	T_EQ_INT(nvio_reap(h, c, 16, 1, 50 * 1000 * 1000), 0);
	dt = now_ns() - t0;
	if (!T_TRUE(dt >= 49 * 1000 * 1000 && dt < 5 * SEC))
		T_FAILF("50 ms reap took %lld ns", (long long)dt);

	t_ctx("%s completion fd", t_combo());
	fd = nvio_completion_fd(h);
	if (!T_TRUE(fd >= 0))
		return;
	T_EQ_INT(nvio_completion_fd(h), fd);	/* the same one */
	T_EQ_INT(readable(fd, 0), 0);
	t_fill_random(file_bytes, 1u << 20, seed++);
	if (!T_OK(t_write_file(path, file_bytes, 1u << 20)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (!f)
		return;
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 8; i++) {
		ops[i].opcode = NVIO_OP_READ;
		ops[i].file = f;
		ops[i].buf = mem + (uint64_t)i * 131072;
		ops[i].nbytes = 100000;
		ops[i].offset = (int64_t)i * 100000 + 1;
		ops[i].user_data = (uint64_t)i;
	}
	T_EQ_INT(nvio_submit(h, ops, 1), 1);
	T_EQ_INT(readable(fd, 10000), 1);
	T_EQ_INT(nvio_reap(h, c, 16, 0, 0), 1);
	T_EQ_INT(readable(fd, 0), 0);

	/* min: waits for all 8; max: never more than asked */
	t_ctx("%s reap min and max", t_combo());
	T_EQ_INT(nvio_submit(h, ops, 8), 8);
	T_EQ_INT(nvio_reap(h, c, 8, 8, -1), 8);
	T_EQ_INT(readable(fd, 0), 0);
	T_EQ_INT(nvio_submit(h, ops, 8), 8);
	k = nvio_reap(h, c, 3, 3, 10 * SEC);
	T_EQ_INT(k, 3);
	T_EQ_U64(nvio_inflight(h), 5);
	T_EQ_INT(reap_n(h, c, 5), 5);
	T_EQ_INT(readable(fd, 0), 0);
	T_EQ_U64(nvio_inflight(h), 0);
	for (int i = 0; i < 8; i++)
		T_MEM_EQ((unsigned char *)ops[i].buf, file_bytes + ops[i].offset,
			 ops[i].nbytes);
	nvio_file_close(f);
}

/* ---- threads submit, one reaps ---- */

#define NSUB 3

struct sub_arg {
	nvio_handle_t *h;
	nvio_file_t *f;
	int id, nops;
};

static void *submitter(void *p)
{
	struct sub_arg *a = p;

	for (int i = 0; i < a->nops; i++) {
		nvio_op_t op;
		int r;

		memset(&op, 0, sizeof(op));
		op.opcode = NVIO_OP_READ;
		op.file = a->f;
		op.buf = mem + ((uint64_t)a->id * (uint64_t)a->nops +
				(uint64_t)i) * 8192;
		op.nbytes = 4096 + (uint64_t)i % 3;
		op.offset = (int64_t)i * 3;
		op.user_data = ((uint64_t)a->id << 32) | (uint64_t)i;
		r = nvio_submit(a->h, &op, 1);
		if (r != 1) {
			T_FAILF("thread %d op %d: nvio_submit %s", a->id, i,
				t_errname(r));
			break;
		}
	}
	return NULL;
}

static void test_threads(nvio_handle_t *h, const char *path)
{
	const int nops = T_TSAN ? 20 : t_quick() ? 50 : 300;
	struct sub_arg args[NSUB];
	pthread_t th[NSUB];
	unsigned char *seen = calloc(NSUB, (size_t)nops);
	nvio_completion_t c[32];
	nvio_file_t *f;
	int total = NSUB * nops, got = 0;

	t_ctx("%s %d threads submit, one reaps", t_combo(), NSUB);
	if (!seen)
		return;
	t_fill_random(file_bytes, 1u << 20, seed++);
	if (!T_OK(t_write_file(path, file_bytes, 1u << 20)))
		goto out;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (!f)
		goto out;
	for (int i = 0; i < NSUB; i++) {
		args[i] = (struct sub_arg){ h, f, i, nops };
		if (pthread_create(&th[i], NULL, submitter, &args[i])) {
			T_FAILF("pthread_create");
			total -= nops;
			args[i].nops = -1;
		}
	}
	while (got < total) {
		int k = nvio_reap(h, c, 32, 1, 10 * SEC);

		if (!T_TRUE(k > 0))
			break;
		for (int i = 0; i < k; i++) {
			uint64_t id = c[i].user_data >> 32,
				 j = c[i].user_data & 0xffffffffu;

			if (!T_TRUE(id < NSUB && j < (uint64_t)nops) ||
			    !T_EQ_INT(seen[id * (uint64_t)nops + j], 0))
				continue;
			seen[id * (uint64_t)nops + j] = 1;
			T_EQ_INT(c[i].res, 4096 + (int64_t)(j % 3));
		}
		got += k;
	}
	for (int i = 0; i < NSUB; i++)
		if (args[i].nops >= 0)
			pthread_join(th[i], NULL);
	T_EQ_INT(got, total);
	T_EQ_U64(nvio_inflight(h), 0);
	nvio_file_close(f);
out:
	free(seen);
}

int main(void)
{
	char path[T_PATH_MAX];

	t_init("completions");
	file_bytes = t_alloc(FSIZE);
	mem = t_alloc((size_t)MAXOPS * 70016 + 8 * 131072);
	t_path(path, "c");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		test_tags(h, path);
		test_partial(h, path);
		test_refused(h, path);
		test_reap_and_fd(h, path);
		test_threads(h, path);
		t_ctx("%s end", t_combo());
		T_EQ_U64(nvio_inflight(h), 0);
		nvio_handle_destroy(h);
		unlink(path);
	}
	free(file_bytes);
	free(mem);
	return t_done();
}

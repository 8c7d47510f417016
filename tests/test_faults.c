/*
 * test_faults.c - injected system call failures through nvio__sys.
 *
 * Every case: install a hook, run one op (sync, then async), remove the
 * hook with nvio__sys_reset(), and check
 *   - an error (EIO, ENOSPC) surfaces as exactly that -errno, from the
 *     sync call or from nvio_wait(), and the next wait returns 0;
 *   - EINTR is retried: the op succeeds and the bytes are right;
 *   - a short count is completed (bytes right) or reported (an error),
 *     never lost: with a 0 return the file/buffer is checked byte by byte.
 * Hooks count calls with atomics (worker threads call them) and only
 * count descriptors that name files in the test directory.
 *
 * Which calls a hook can reach depends on the engine: completions of
 * every engine pass io_result; pread/pwrite are psync's (and of buffered
 * heads/tails); reap_fault is called by engines that wait for
 * completions (io_uring, libaio). A hook that should have fired but never
 * did is a failure for the engines it is documented for.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define OPSZ (256u << 10)	/* 4 pieces of BS */
#define BS (64u << 10)
#define OFF 4096

static struct nvio__sys real;
static atomic_int calls;	/* matching calls seen */
static atomic_int fired;	/* faults injected */
static int fail_at;		/* which matching call fails (1-based) */
static int fail_errno;		/* errno to give (pread/pwrite/...) */
static int fail_kind;		/* see enum */
static int want_write;		/* io_result: direction to hit */
static uint64_t seed = 9000;

enum { K_ERR, K_SHORT_HALF, K_SHORT_ZERO, K_ONCE_EINTR, K_ERR_FROM };

static int hit(int fd)
{
	int k;

	if (fd >= 0 && !t_fd_is_ours(fd))
		return 0;
	k = atomic_fetch_add(&calls, 1) + 1;
	if (fail_kind == K_ERR_FROM ? k < fail_at : k != fail_at)
		return 0;	/* K_ERR_FROM: that call and every later one */
	atomic_fetch_add(&fired, 1);
	return 1;
}

static ssize_t h_pread(int fd, void *buf, size_t n, off_t off)
{
	if (!hit(fd))
		return real.pread(fd, buf, n, off);
	if (fail_kind == K_SHORT_HALF && n > 1)
		return real.pread(fd, buf, n / 2, off);
	errno = fail_errno;
	return -1;
}

static ssize_t h_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (!hit(fd))
		return real.pwrite(fd, buf, n, off);
	if (fail_kind == K_SHORT_HALF && n > 1)
		return real.pwrite(fd, buf, n / 2, off);
	errno = fail_errno;
	return -1;
}

static ssize_t h_io_result(int is_write, int fd, uint64_t off, size_t n,
			   ssize_t res)
{
	if (is_write != want_write || !hit(fd))
		return res;
	switch (fail_kind) {
	case K_SHORT_HALF:
		return res > 1 ? res / 2 : res;
	case K_SHORT_ZERO:
		return 0;
	default:
		return -fail_errno;
	}
}

static int h_reap_fault(void)
{
	return hit(-1) ? -fail_errno : 0;
}

static int h_fsync(int fd)
{
	if (!hit(-1))
		return real.fsync(fd);
	errno = fail_errno;
	return -1;
}

static int h_rename(const char *a, const char *b)
{
	if (!hit(-1))
		return real.rename(a, b);
	errno = fail_errno;
	return -1;
}

static void arm(int at, int kind, int err)
{
	nvio__sys_reset();
	atomic_store(&calls, 0);
	atomic_store(&fired, 0);
	fail_at = at;
	fail_kind = kind;
	fail_errno = err;
}

static unsigned char *buf, *file, *chk;
static unsigned char *buf_base;	/* buf is buf_base or buf_base + 1 */

/* Runs one write or read of OPSZ at off with the armed hook; returns the
 * op's result (sync) or the wait's (async). */
static int run(nvio_handle_t *h, const char *path, int is_write, int async,
	       uint64_t n, int64_t off, uint64_t s)
{
	int r;

	/* libc prepares the file: old content for writes, data for reads. */
	t_fill_random(file, OPSZ + 2 * OFF, s + 1);
	t_write_file(path, file, OPSZ + 2 * OFF);
	if (is_write) {
		t_fill_random(buf, n, s);
		memcpy(file + off, buf, n);
	} else {
		memset(buf, 0, n);
	}
	r = is_write ?
	    nvio_pwrite(h, buf, n, path, off, async ? NVIO_ASYNC : 0) :
	    nvio_pread(h, buf, n, path, off, async ? NVIO_ASYNC : 0);
	if (async) {
		if (!T_OK(r))
			return r;
		r = nvio_wait(h);
		if (r == 1)
			r = 0;
	}
	return r;
}

/* After a successful op, the bytes must be right. */
static void check_bytes(const char *path, int is_write, uint64_t n,
			int64_t off)
{
	size_t sz = 0;

	if (is_write) {
		if (T_OK(t_read_file(path, chk, OPSZ + 2 * OFF, &sz)) &&
		    T_EQ_U64(sz, OPSZ + 2 * OFF))
			T_MEM_EQ(chk, file, OPSZ + 2 * OFF);
	} else {
		T_MEM_EQ(buf, file + off, n);
	}
}

/*
 * One case: hook armed for the at-th matching call. `must_fire`: the hook
 * has to be reached on this engine. Expected: err (exact -errno) or 0.
 */
static void one_case(nvio_handle_t *h, const char *path, const char *what,
		     void (*install)(void), int at, int kind, int err,
		     int is_write, int must_fire, int want)
{
	for (int async = 0; async < 2; async++) {
		uint64_t n = OPSZ;
		int64_t off = OFF;
		int r, f;

		t_ctx("%s%s", what, async ? " async" : "");
		arm(at, kind, err);
		install();
		r = run(h, path, is_write, async, n, off, seed++);
		nvio__sys_reset();
		f = atomic_load(&fired);
		if (!f) {
			if (must_fire)
				T_FAILF("the hook was not reached (%d matching "
					"calls, needed %d)", atomic_load(&calls),
					at);
			T_OK(r);
			check_bytes(path, is_write, n, off);
		} else if (kind == K_SHORT_HALF || kind == K_SHORT_ZERO) {
			/* completed (bytes right) or reported, never lost */
			if (r == 0)
				check_bytes(path, is_write, n, off);
			else if (r > 0)
				T_FAILF("got %d, expected 0 or an error", r);
			else
				t_note("%s: short count reported as %s", what,
				       t_errname(r));
		} else {
			T_ERR(r, want);
			if (want == 0)
				check_bytes(path, is_write, n, off);
		}
		if (async)
			T_ERR(nvio_wait(h), 0);
		T_EQ_U64(nvio_pending(h), 0);
		if (r < 0) {
			nvio_error_t e = { .struct_size = sizeof(e) };

			memset(&e, 0, sizeof(e));
			e.struct_size = sizeof(e);
			nvio_last_error(h, &e);
			T_ERR(e.err, r);
			T_EQ_INT(e.is_write, is_write);
		}
		/* The handle still works afterwards. */
		r = run(h, path, is_write, 0, n, off, seed++);
		T_OK(r);
		check_bytes(path, is_write, n, off);
	}
}

static void i_pread(void) { nvio__sys.pread = h_pread; }
static void i_pwrite(void) { nvio__sys.pwrite = h_pwrite; }
static void i_result_w(void) { want_write = 1; nvio__sys.io_result = h_io_result; }
static void i_result_r(void) { want_write = 0; nvio__sys.io_result = h_io_result; }
static void i_reap(void) { nvio__sys.reap_fault = h_reap_fault; }

static void faults(nvio_handle_t *h, int e, const char *combo)
{
	char path[T_PATH_MAX], what[160];
	int psync = e == NVIO_ENGINE_PSYNC;
	int ring = e == NVIO_ENGINE_URING || e == NVIO_ENGINE_AIO;
	static const int errs[] = { EIO, ENOSPC };

	t_path(path, "faults");
	for (int k = 0; k < 2; k++) {
		int er = errs[k];

		snprintf(what, sizeof(what), "%s pwrite call 2 fails %s", combo,
			 t_errname(-er));
		one_case(h, path, what, i_pwrite, 2, K_ERR, er, 1, psync, -er);
		snprintf(what, sizeof(what), "%s pread call 2 fails %s", combo,
			 t_errname(-er));
		one_case(h, path, what, i_pread, 2, K_ERR, er, 0, psync, -er);
		snprintf(what, sizeof(what), "%s write completion 2 is %s",
			 combo, t_errname(-er));
		one_case(h, path, what, i_result_w, 2, K_ERR, er, 1, 1, -er);
		snprintf(what, sizeof(what), "%s read completion 3 is %s",
			 combo, t_errname(-er));
		one_case(h, path, what, i_result_r, 3, K_ERR, er, 0, 1, -er);
	}
	snprintf(what, sizeof(what), "%s pread EINTR once", combo);
	one_case(h, path, what, i_pread, 1, K_ERR, EINTR, 0, psync, 0);
	snprintf(what, sizeof(what), "%s pwrite EINTR once", combo);
	one_case(h, path, what, i_pwrite, 1, K_ERR, EINTR, 1, psync, 0);
	snprintf(what, sizeof(what), "%s pread short once", combo);
	one_case(h, path, what, i_pread, 2, K_SHORT_HALF, 0, 0, psync, 0);
	snprintf(what, sizeof(what), "%s pwrite short once", combo);
	one_case(h, path, what, i_pwrite, 2, K_SHORT_HALF, 0, 1, psync, 0);
	snprintf(what, sizeof(what), "%s write completion 2 short", combo);
	one_case(h, path, what, i_result_w, 2, K_SHORT_HALF, 0, 1, 1, 0);
	snprintf(what, sizeof(what), "%s read completion 2 short", combo);
	one_case(h, path, what, i_result_r, 2, K_SHORT_HALF, 0, 0, 1, 0);
	snprintf(what, sizeof(what), "%s write completion 1 is 0 bytes", combo);
	one_case(h, path, what, i_result_w, 1, K_SHORT_ZERO, 0, 1, 1, 0);
	snprintf(what, sizeof(what), "%s read completion 4 is 0 bytes", combo);
	one_case(h, path, what, i_result_r, 4, K_SHORT_ZERO, 0, 0, 1, 0);
	/* retried, but not forever */
	snprintf(what, sizeof(what), "%s read completions from 2 on EAGAIN",
		 combo);
	one_case(h, path, what, i_result_r, 2, K_ERR_FROM, EAGAIN, 0, 1, -EAGAIN);
	snprintf(what, sizeof(what), "%s write completions from 1 on EBUSY",
		 combo);
	one_case(h, path, what, i_result_w, 1, K_ERR_FROM, EBUSY, 1, 1, -EBUSY);
	snprintf(what, sizeof(what), "%s reap_fault EINTR once (read)", combo);
	one_case(h, path, what, i_reap, 1, K_ERR, EINTR, 0, ring, 0);
	snprintf(what, sizeof(what), "%s reap_fault EINTR once (write)", combo);
	one_case(h, path, what, i_reap, 1, K_ERR, EINTR, 1, ring, 0);
	unlink(path);
}

/* ---- nvio_write_file failing midway ---- */

static int h_open_fail(const char *p, int flags, mode_t mode)
{
	if (!hit(-1))
		return real.open(p, flags, mode);
	errno = fail_errno;
	return -1;
}

static int h_close(int fd)
{
	if (!hit(fd))
		return real.close(fd);
	real.close(fd);		/* closed, as Linux does, but it reports */
	errno = fail_errno;
	return -1;
}

static void i_fsync(void) { nvio__sys.fsync = h_fsync; }
static void i_close(void) { nvio__sys.close = h_close; }
static void i_rename(void) { nvio__sys.rename = h_rename; }
static void i_open(void) { nvio__sys.open = h_open_fail; }

static void list_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			fprintf(stderr, "    left in %s: %s\n", dir, de->d_name);
	closedir(d);
}

static void write_file_case(nvio_handle_t *h, const char *combo,
			    const char *what, void (*install)(void), int at,
			    int err, unsigned flags, int must_fire)
{
	char dir[T_PATH_MAX], path[T_PATH_MAX];
	enum { OLD = 100000, NEW = 200000 };
	size_t sz = 0;
	int r, f;

	t_ctx("%s write_file fails: %s", combo, what);
	t_subdir(dir, "wf");
	snprintf(path, sizeof(path), "%s/target", dir);
	t_fill_random(file, OLD, seed++);
	if (t_write_file(path, file, OLD))
		return;
	t_fill_random(buf, NEW, seed++);
	arm(at, K_ERR, err);
	install();
	r = nvio_write_file(h, buf, NEW, path, flags);
	if (flags & NVIO_ASYNC) {
		if (T_OK(r))
			r = nvio_wait(h);
	}
	nvio__sys_reset();
	f = atomic_load(&fired);
	if (!f) {
		if (must_fire)
			T_FAILF("the hook was not reached (%d calls, needed %d)",
				atomic_load(&calls), at);
		if (r == 1 && (flags & NVIO_ASYNC))
			r = 0;
		T_OK(r);
	} else {
		T_ERR(r, -err);
		/* The old file untouched, and nothing else left there. */
		if (T_OK(t_read_file(path, chk, NEW, &sz)) &&
		    T_EQ_U64(sz, OLD))
			T_MEM_EQ(chk, file, OLD);
		if (!T_EQ_INT(t_dir_count(dir), 1))
			list_dir(dir);
	}
	T_ERR(nvio_wait(h), 0);
	unlink(path);
	rmdir(dir);
}

static void write_file_faults(nvio_handle_t *h, int e, const char *combo)
{
	int psync = e == NVIO_ENGINE_PSYNC;

	write_file_case(h, combo, "write completion 2 ENOSPC", i_result_w, 2,
			ENOSPC, 0, 1);
	write_file_case(h, combo, "write completion 3 EIO, async", i_result_w,
			3, EIO, NVIO_ASYNC, 1);
	write_file_case(h, combo, "pwrite 2 ENOSPC", i_pwrite, 2, ENOSPC, 0,
			psync);
	write_file_case(h, combo, "rename EIO", i_rename, 1, EIO, 0, 1);
	write_file_case(h, combo, "rename EXDEV", i_rename, 1, EXDEV, 0, 1);
	write_file_case(h, combo, "fsync EIO with NVIO_FSYNC", i_fsync, 1, EIO,
			NVIO_FSYNC, 1);
	write_file_case(h, combo, "open EACCES", i_open, 1, EACCES, 0, 1);
	/* writeback errors can come with the close (NFS) */
	write_file_case(h, combo, "close EIO", i_close, 1, EIO, 0, 1);
}

/* A failing open surfaces as its error for the range ops too. */
static void check_file_is(const char *path, const unsigned char *want, size_t n)
{
	struct stat st;

	T_OK(stat(path, &st) < 0 ? -errno : 0);
	T_EQ_U64((uint64_t)st.st_size, n);
	size_t got = 0;

	T_OK(t_read_file(path, chk, n, &got));
	T_EQ_U64(got, n);
	T_MEM_EQ(chk, want, n);
}

static void open_faults(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX];

	t_path(path, "openfail");
	t_write_file(path, "abc", 3);
	for (int async = 0; async < 2; async++) {
		unsigned fl = async ? NVIO_ASYNC : 0;

		t_ctx("%s open EMFILE%s", combo, async ? " async" : "");
		arm(1, K_ERR, EMFILE);
		i_open();
		T_ERR(nvio_pread(h, buf, 3, path, 0, fl), -EMFILE);
		arm(1, K_ERR, EACCES);
		i_open();
		T_ERR(nvio_pwrite(h, buf, 3, path, 0, fl), -EACCES);
		nvio__sys_reset();
		T_ERR(nvio_wait(h), 0);
		T_EQ_U64(nvio_pending(h), 0);
		/* EINTR on open is retried. */
		arm(1, K_ERR, EINTR);
		i_open();
		T_OK(nvio_pread(h, buf, 3, path, 0, 0));
		nvio__sys_reset();
		T_MEM_EQ(buf, "abc", 3);
	}
	unlink(path);
}

static int h_fallocate_enospc(int fd, int mode, off_t off, off_t len)
{
	atomic_fetch_add(&calls, 1);
	errno = ENOSPC;
	return -1;
}

/*
 * A write that grows a file is allocated first, so a full disk fails it
 * at submit with -ENOSPC and no byte of the old content changes.
 */
static void enospc_at_submit(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX];
	unsigned char old[8192];

	t_path(path, "full");
	t_fill_random(old, sizeof(old), 77);
	t_write_file(path, old, sizeof(old));
	for (int async = 0; async < 2; async++) {
		t_ctx("%s fallocate ENOSPC%s", combo, async ? " async" : "");
		atomic_store(&calls, 0);
		nvio__sys.fallocate = h_fallocate_enospc;
		T_ERR(nvio_pwrite(h, buf, OPSZ, path, 4096, async ? NVIO_ASYNC : 0),
		      -ENOSPC);
		nvio__sys_reset();
		T_ERR(nvio_wait(h), 0);
		check_file_is(path, old, sizeof(old));
		/* a write inside the file needs no allocation */
		nvio__sys.fallocate = h_fallocate_enospc;
		T_OK(nvio_pwrite(h, buf, 100, path, 10, 0));
		nvio__sys_reset();
		memcpy(old + 10, buf, 100);
		check_file_is(path, old, sizeof(old));
	}
	unlink(path);
}

/*
 * The record behind a wait's error is the failed op's, even when a later
 * call failed otherwise in between: an async write fails with EIO in a
 * worker, then a sync read of a missing file fails with ENOENT, then the
 * wait returns -EIO and nvio_last_error() must name the write.
 */
static void wait_record(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX], missing[T_PATH_MAX + 16];
	nvio_error_t e = { .struct_size = sizeof(e) };
	int r;

	t_ctx("%s wait's record after a later sync failure", combo);
	t_path(path, "waitrec");
	snprintf(missing, sizeof(missing), "%s-missing", path);
	t_fill_random(file, OPSZ + 2 * OFF, seed++);
	t_write_file(path, file, OPSZ + 2 * OFF);
	arm(2, K_ERR, EIO);
	i_result_w();
	r = nvio_pwrite(h, buf, OPSZ, path, OFF, NVIO_ASYNC);
	if (!T_OK(r)) {
		nvio__sys_reset();
		return;
	}
	/* Let the write fail first, so its record is the older one. */
	for (int i = 0; i < 2000 && !atomic_load(&fired); i++)
		usleep(1000);
	usleep(20000);
	T_ERR(nvio_pread(h, chk, 10, missing, 0, 0), -ENOENT);
	r = nvio_wait(h);
	nvio__sys_reset();
	T_ERR(r, -EIO);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -EIO);
	T_EQ_INT(e.is_write, 1);
	if (strcmp(e.path, path) != 0)
		T_FAILF("last_error() names \"%s\", not the failed write's "
			"\"%s\"", e.path, path);
	unlink(path);
}

/*
 * Batch mode prepares the next batch while one runs. When a request of
 * the running batch fails, the op has failed: nothing more of it may
 * reach the device (for a write, no data after the error). Every
 * request passes io_result once, so the count is what was issued: the
 * first batch only, aligned or staged, read or write.
 */
static void stop_after_failure(int e, int d)
{
	const uint32_t qd = 4;
	const uint64_t n = 16 * (uint64_t)BS;	/* four batches */
	unsigned char *mem = t_alloc(n + 1);
	char path[T_PATH_MAX];

	t_path(path, "stop");
	for (int mis = 0; mis < 2; mis++)
		for (int w = 0; w < 2; w++) {
			nvio_config_t c;
			nvio_handle_t *h = NULL;
			int r;

			t_ctx("%s/%s batch stops at a failure, %s, mis %d",
			      t_engine_str(e), t_direct_str(d),
			      w ? "write" : "read", mis);
			t_config(&c, e, d, BS, qd);
			c.overlap_events = 0;
			if (!T_OK(nvio_handle_create(&h, &c)))
				continue;
			t_fill_random(mem + mis, n, seed++);
			if (t_write_file(path, mem + mis, n)) {
				T_FAILF("libc write of %s failed", path);
				nvio_handle_destroy(h);
				continue;
			}
			arm(1, K_ERR, EIO);
			want_write = w;
			nvio__sys.io_result = h_io_result;
			r = w ? nvio_pwrite(h, mem + mis, n, path, 0, 0) :
				nvio_pread(h, mem + mis, n, path, 0, 0);
			nvio__sys_reset();
			T_ERR(r, -EIO);
			T_EQ_INT(atomic_load(&fired), 1);
			T_EQ_INT(atomic_load(&calls), qd);
			T_EQ_INT(nvio_wait(h), 0);
			nvio_handle_destroy(h);
		}
	unlink(path);
	free(mem);
}

/*
 * The file is replaced (renamed over) between nvio's buffered open and
 * its O_DIRECT open by name: the second must still be the first's file,
 * or a read would take its head from one file and its body from another.
 */
static char swap_from[T_PATH_MAX], swap_to[T_PATH_MAX];

static int h_open_swap(const char *p, int flags, mode_t mode)
{
	if ((flags & O_DIRECT) && swap_to[0] && strcmp(p, swap_to) == 0) {
		rename(swap_from, swap_to);
		swap_to[0] = 0;
	}
	return real.open(p, flags, mode);
}

static void replaced_between_opens(int e, int d)
{
	const uint64_t n = 3 * BS + 777;
	char target[T_PATH_MAX];
	nvio_handle_t *h;

	t_ctx("%s/%s file replaced between the opens", t_engine_str(e),
	      t_direct_str(d));
	if (t_handle(&h, e, d, 1, BS))
		return;
	t_path(target, "swap");		/* the hook clears swap_to */
	t_path(swap_to, "swap");
	t_path(swap_from, "swap-new");
	memset(file, 'N', n + 2 * OFF);
	t_write_file(swap_from, file, n + 2 * OFF);
	t_fill_random(file, n + 2 * OFF, seed++);
	t_write_file(swap_to, file, n + 2 * OFF);
	nvio__sys.open = h_open_swap;
	memset(buf, 0, n);
	T_OK(nvio_pread(h, buf, n, target, 100, 0));
	nvio__sys_reset();
	T_MEM_EQ(buf, file + 100, n);
	if (d == NVIO_DIRECT_ON)
		T_EQ_INT(swap_to[0], 0);	/* the swap happened */
	unlink(swap_from);
	unlink(target);
	nvio_handle_destroy(h);
}

/*
 * A failed wait makes the worker reset its engine. What the kernel still
 * holds must finish first: after the op has returned its error, nothing
 * may land in its buffer (a closed io_uring finishes its requests later).
 */
static void reset_drains(int e, int d)
{
	const uint64_t n = 64u << 20;
	unsigned char *mem = aligned_alloc(4096, n);
	char path[T_PATH_MAX];
	nvio_config_t c;
	nvio_handle_t *h = NULL;
	uint64_t late = 0;

	t_ctx("%s/%s engine reset drains", t_engine_str(e), t_direct_str(d));
	t_path(path, "drain");
	t_config(&c, e, d, 512u << 10, 128);
	if (!T_TRUE(mem != NULL) || !T_OK(nvio_handle_create(&h, &c))) {
		free(mem);
		return;
	}
	t_fill_random(mem, n, seed++);
	if (!t_write_file(path, mem, n)) {
		for (int round = 0; round < 3 && !late; round++) {
			arm(1, K_ERR, EIO);
			nvio__sys.reap_fault = h_reap_fault;
			T_ERR(nvio_pread(h, mem, n, path, 0, 0), -EIO);
			nvio__sys_reset();
			memset(mem, 'M', n);
			usleep(100 * 1000);
			for (uint64_t i = 0; i < n; i += 4096)
				late += mem[i] != 'M';
		}
		T_EQ_U64(late, 0);
	}
	nvio_handle_destroy(h);
	unlink(path);
	free(mem);
}

int main(void)
{
	t_init("faults");
	nvio__sys_reset();
	real = nvio__sys;
	buf = buf_base = t_alloc(OPSZ + 2 * OFF + 1);
	file = t_alloc(OPSZ + 2 * OFF);
	chk = t_alloc(OPSZ + 2 * OFF);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;
		char combo[64];

		snprintf(combo, sizeof(combo), "%s", t_combo());
		t_ctx("%s create", combo);
		if (t_handle(&h, e, d, 1, BS))
			continue;
		faults(h, e, combo);
		/* the same through the staging buffers */
		buf = buf_base + 1;
		snprintf(combo, sizeof(combo), "%s staged", t_combo());
		faults(h, e, combo);
		buf = buf_base;
		snprintf(combo, sizeof(combo), "%s", t_combo());
		write_file_faults(h, e, combo);
		open_faults(h, combo);
		enospc_at_submit(h, combo);
		wait_record(h, combo);
		nvio__sys_reset();
		nvio_handle_destroy(h);
		stop_after_failure(e, d);
		reset_drains(e, d);
		replaced_between_opens(e, d);
	}
	free(buf_base);
	free(file);
	free(chk);
	return t_done();
}

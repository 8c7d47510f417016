/*
 * test_rollback.c - a write that fails leaves nothing behind.
 *
 * A write that grows a file and then fails (an I/O error on the way, or
 * a full disk at allocation) puts the file back to its old size, with
 * the space it allocated freed; a one-buffer write that created the file
 * removes it. An existing file is never removed. Faults are injected
 * through the system-call table (sys.h); on every engine, direct on and
 * off. Sizes and allocated blocks are read with stat(2).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define OLD (64u << 10)
#define GROW (4u << 20)

static ssize_t eio_writes(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	return is_write ? -EIO : res;
}

static int enospc_fallocate(int fd, int mode, off_t off, off_t len)
{
	errno = ENOSPC;
	return -1;
}

static void check_size(const char *path, off_t size, blkcnt_t max_blocks)
{
	struct stat st;

	if (!T_OK(stat(path, &st) < 0 ? -errno : 0))
		return;
	T_EQ_INT(st.st_size, size);
	if (st.st_blocks > max_blocks)
		T_FAILF("%s holds %lld blocks after the failed write, at most %lld expected",
			path, (long long)st.st_blocks, (long long)max_blocks);
}

static void one(int engine, int direct, unsigned char *buf)
{
	char path[T_PATH_MAX], fresh[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *f;
	int err;

	if (t_handle(&h, engine, direct, 1, 0))
		return;
	t_path(path, "old");
	t_path(fresh, "fresh");
	t_fill_random(buf, GROW, 3);
	for (int fault = 0; fault < 2; fault++) {
		const char *what = fault ? "ENOSPC at allocation" : "EIO while writing";
		int want = fault ? -ENOSPC : -EIO;

		/* an existing file grown by a one-buffer write */
		t_ctx("%s %s: existing file", t_combo(), what);
		T_OK(t_write_file(path, buf, OLD));
		if (fault)
			nvio__sys.fallocate = enospc_fallocate;
		else
			nvio__sys.io_result = eio_writes;
		T_ERR(nvio_pwrite(h, buf, GROW, path, OLD, 0), want);
		/* a new file */
		t_ctx("%s %s: new file", t_combo(), what);
		unlink(fresh);
		T_ERR(nvio_pwrite(h, buf, GROW, fresh, 0, 0), want);
		nvio__sys_reset();
		check_size(path, OLD, (OLD + 8192) / 512);
		T_TRUE(access(fresh, F_OK) != 0);
		/* an open file: back to its size, and the file stays */
		t_ctx("%s %s: open file", t_combo(), what);
		f = nvio_file_open(h, path, NVIO_FILE_WRITE, &err);
		if (!T_TRUE(f != NULL))
			continue;
		if (fault)
			nvio__sys.fallocate = enospc_fallocate;
		else
			nvio__sys.io_result = eio_writes;
		T_ERR(nvio_file_pwrite(f, buf, GROW, OLD, 0), want);
		nvio__sys_reset();
		check_size(path, OLD, (OLD + 8192) / 512);
		T_OK(nvio_file_close(f));
		/* a write inside the file that fails shrinks nothing */
		t_ctx("%s %s: write inside", t_combo(), what);
		if (!fault) {
			nvio__sys.io_result = eio_writes;
			T_ERR(nvio_pwrite(h, buf, 8192, path, 0, 0), -EIO);
			nvio__sys_reset();
			check_size(path, OLD, (OLD + 8192) / 512);
		}
	}
	unlink(path);
	nvio_handle_destroy(h);
}

int main(void)
{
	unsigned char *buf;

	t_init("rollback");
	buf = t_alloc(GROW);
	T_FOR_EACH_COMBO(e, d) {
		one(e, d, buf);
	}
	free(buf);
	return t_done();
}

/*
 * test_spare_create_race.c - two spare saves find no spare and both make
 * one: the first creates it (O_EXCL), the second opens the new name and
 * locks it before the first can. The first's flock then fails with
 * EWOULDBLOCK: the spare is the other writer's now, and the first must
 * leave it (an ordinary temporary instead). It used to unlink it, as it
 * unlinks one it made on a file system without flock: the other writer,
 * its file nameless, then failed its commit with "link of ck.pt failed:
 * ENOENT" (test_hostile's spare_saves, 1 run in 10). The other writer is
 * this test: its lock is taken through the nvio__sys table, between the
 * first writer's create and its flock. Every engine, direct I/O on and
 * off.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N 40000

static struct nvio__sys real;
static int other = -1;		/* the other writer's descriptor, locked */
static char dir[T_PATH_MAX], target[T_PATH_MAX], spare[T_PATH_MAX];
static unsigned char *buf, *back;

/* The first exclusive lock: the other writer takes the spare first. */
static int h_flock(int fd, int op)
{
	if (other < 0 && op == (LOCK_EX | LOCK_NB)) {
		other = open(spare, O_RDWR | O_CLOEXEC);
		if (other >= 0 && real.flock(other, LOCK_EX | LOCK_NB) < 0) {
			close(other);
			other = -1;
		}
	}
	return real.flock(fd, op);
}

static int save(nvio_handle_t *h, uint64_t seed)
{
	nvio_file_t *f;
	int err = 0, r;

	t_fill_random(buf, N, seed);
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (!f)
		return err;
	r = nvio_file_pwrite(f, buf, N, 0, 0);
	if (!r)
		r = nvio_file_commit(f);
	if (nvio_file_close(f) < 0 && !r)
		r = -EIO;
	return r;
}

static void one(nvio_handle_t *h)
{
	struct stat mine, named;
	size_t size = 0;

	T_OK(t_write_file(target, "old", 3));	/* a target, no spare yet */
	other = -1;
	nvio__sys.flock = h_flock;
	T_OK(save(h, 7));
	nvio__sys.flock = real.flock;
	/* the other writer got the spare the save made ... */
	if (!T_EQ_INT(other >= 0, 1))
		return;
	/* ... and it is still there under the spare's name, its only one */
	T_OK(fstat(other, &mine));
	if (T_EQ_INT(stat(spare, &named), 0))
		T_EQ_U64(named.st_ino, mine.st_ino);
	T_EQ_U64(mine.st_nlink, 1);
	/* the save went through an ordinary temporary, whole */
	if (T_OK(t_read_file(target, back, N, &size)) && T_EQ_U64(size, N))
		T_EQ_INT(t_check_random_at(back, N, 7, 0), -1);
	/* target and spare, no temporary left */
	T_EQ_INT(t_dir_count(dir), 2);
	close(other);
	other = -1;
	/* the next save takes the spare the other writer let go */
	T_OK(save(h, 8));
	if (T_EQ_INT(stat(target, &named), 0))
		T_EQ_U64(named.st_ino, mine.st_ino);
	if (T_OK(t_read_file(target, back, N, &size)) && T_EQ_U64(size, N))
		T_EQ_INT(t_check_random_at(back, N, 8, 0), -1);
	unlink(spare);
	unlink(target);
}

int main(void)
{
	t_init("spare_create_race");
	real = nvio__sys;
	buf = t_alloc(N);
	back = t_alloc(N);
	t_subdir(dir, "d");
	snprintf(target, sizeof(target), "%s/ck.pt", dir);
	snprintf(spare, sizeof(spare), "%s/.ck.pt.nvio-spare", dir);
	T_FOR_EACH_COMBO(en, d) {
		nvio_handle_t *h;

		if (t_handle(&h, en, d, 2, 0))
			continue;
		one(h);
		nvio_handle_destroy(h);
	}
	free(buf);
	free(back);
	return t_done();
}

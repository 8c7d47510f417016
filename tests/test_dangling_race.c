/*
 * test_dangling_race.c - a save through a link the kernel found dangling
 * follows the rest of the chain by open(2)'s rule too. Another user in a
 * sticky world-writable directory flips the name between the kernel's
 * follow (nothing there: ENOENT) and the library's own reading of the
 * dangling chain (now the user's link to root's file). With
 * fs.protected_symlinks on, that link must be refused (-EACCES) and root's
 * file keep its bytes; the user-space follow took it and replaced root's
 * file. The race is made certain through the nvio__sys.open hook, which
 * also shows the library the sysctl as 1 (the machine's may not be
 * settable). Plain, spare and whole-file saves, every engine, direct I/O
 * on and off. Needs root (a link owned by another uid); else it skips.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define SYSCTL "/proc/sys/fs/protected_symlinks"
#define NOBODY 65534
#define N 20000

static struct nvio__sys real;
static char sticky[T_PATH_MAX], victim[T_PATH_MAX], link_path[T_PATH_MAX],
	    fake_sysctl[T_PATH_MAX];
static unsigned char *buf, *back;
static int flips;

/* The attacker: at the kernel's O_PATH follow of link_path, the name is
 * gone (ENOENT); right after, it is the attacker's link to victim. */
static int h_open(const char *p, int fl, mode_t m)
{
	if (!strcmp(p, SYSCTL))
		return real.open(fake_sysctl, fl, m);
	if ((fl & O_PATH) && !(fl & O_NOFOLLOW) && !strcmp(p, link_path)) {
		flips++;
		unlink(link_path);
		if (symlink(victim, link_path) == 0)
			(void)lchown(link_path, NOBODY, (gid_t)-1);
		errno = ENOENT;
		return -1;
	}
	return real.open(p, fl, m);
}

static int save(nvio_handle_t *h, int how)
{
	nvio_file_t *f;
	int err = 0, r;

	t_fill_random(buf, N, 7);
	if (how == 2)
		return nvio_write_file(h, buf, N, link_path, 0);
	f = nvio_file_open(h, link_path, NVIO_FILE_ATOMIC |
			   (how ? NVIO_FILE_SPARE : 0), &err);
	if (!f)
		return err;
	r = nvio_file_pwrite(f, buf, N, 0, 0);
	if (!r)
		r = nvio_file_commit(f);
	if (nvio_file_close(f) < 0 && !r)
		r = -EIO;
	return r;
}

static void one(nvio_handle_t *h, int how)
{
	size_t size = 0;

	t_fill_random(back, N / 2, 3);
	T_OK(t_write_file(victim, back, N / 2));
	/* the attacker's dangling link: the kernel sees it first */
	unlink(link_path);
	T_OK(symlink("gone", link_path) < 0 ? -errno : 0);
	T_OK(lchown(link_path, NOBODY, (gid_t)-1) < 0 ? -errno : 0);
	flips = 0;
	nvio__sys.open = h_open;
	T_EQ_INT(save(h, how), -EACCES);
	nvio__sys.open = real.open;
	T_EQ_INT(flips > 0, 1);
	if (T_OK(t_read_file(victim, back, N, &size)) && T_EQ_U64(size, N / 2))
		T_EQ_INT(t_check_random_at(back, N / 2, 3, 0), -1);
	unlink(link_path);
}

int main(void)
{
	t_init("dangling_race");
	if (geteuid() != 0)
		t_skip("a link owned by another user needs root");
	real = nvio__sys;
	buf = t_alloc(N);
	back = t_alloc(N);
	t_subdir(sticky, "sticky");
	T_OK(chmod(sticky, 01777) < 0 ? -errno : 0);
	t_path(victim, "victim");
	t_path(fake_sysctl, "protected_symlinks");
	T_OK(t_write_file(fake_sysctl, "1\n", 2));
	snprintf(link_path, sizeof(link_path), "%s/ck.pt", sticky);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 0))
			continue;
		for (int how = 0; how < 3; how++)
			one(h, how);
		nvio_handle_destroy(h);
	}
	free(buf);
	free(back);
	return t_done();
}

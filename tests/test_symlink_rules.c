/*
 * test_symlink_rules.c - an atomic write through a symbolic link follows
 * exactly the links open(2) would follow, and no others. With
 * fs.protected_symlinks on, a link another user planted in a sticky
 * world-writable directory (as in /tmp) is refused: the save fails with
 * -EACCES, the file it points to keeps its bytes and inode, and no spare
 * or temporary appears beside it, for plain, spare and whole-file
 * (nvio_write_file) saves, with the link's target there or dangling. The
 * caller's own link there still works (the file it names is replaced,
 * the link stays a link); with the sysctl off the other user's link is
 * followed, as open(2) follows it. Every engine, direct I/O on and off.
 *
 * Needs root (a link owned by another uid, the sysctl set for the run;
 * restored at exit); else it skips.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"

#define SYSCTL "/proc/sys/fs/protected_symlinks"
#define NOBODY 65534
#define N 20000

static unsigned char *buf, *back;
static char sticky[T_PATH_MAX], victim[T_PATH_MAX], link_path[T_PATH_MAX],
	    victim_dir[T_PATH_MAX];
static int old_sysctl = -1;

static int read_sysctl(void)
{
	char s[8] = "";
	FILE *fp = fopen(SYSCTL, "r");
	int v = -1;

	if (fp && fgets(s, sizeof(s), fp))
		v = atoi(s);
	if (fp)
		fclose(fp);
	return v;
}

static int write_sysctl(int v)
{
	FILE *fp = fopen(SYSCTL, "w");
	int ok = fp && fprintf(fp, "%d\n", v) > 0;

	if (fp && fclose(fp) != 0)
		ok = 0;
	return ok && read_sysctl() == v ? 0 : -1;
}

static void restore_sysctl(void)
{
	if (old_sysctl >= 0)
		(void)write_sysctl(old_sysctl);
}

/* Entries of victim_dir other than . and .. */
static int entries(void)
{
	return t_dir_count(victim_dir);
}

static ino_t ino_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? st.st_ino : 0;
}

/* A link at link_path to to, owned by uid. */
static void plant(const char *to, uid_t uid)
{
	unlink(link_path);
	T_OK(symlink(to, link_path) < 0 ? -errno : 0);
	T_OK(lchown(link_path, uid, (gid_t)-1) < 0 ? -errno : 0);
}

/* One save of N bytes of stream seed through the link: 0 or -errno. */
static int save(nvio_handle_t *h, int how, uint64_t seed)
{
	nvio_file_t *f;
	int err = 0, r;

	t_fill_random(buf, N, seed);
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

static void check_victim(size_t n, uint64_t seed)
{
	size_t size = 0;

	if (!T_OK(t_read_file(victim, back, N, &size)))
		return;
	if (T_EQ_U64(size, n))
		T_EQ_INT(t_check_random_at(back, n, seed, 0), -1);
}

static void refused(nvio_handle_t *h)
{
	static const char *const hows[] = { "plain", "spare", "write_file" };
	nvio_error_t e;
	ino_t ino;

	for (int how = 0; how < 3; how++) {
		t_ctx("%s other user's link, %s save", t_combo(), hows[how]);
		t_fill_random(buf, 1000, 1);
		T_OK(t_write_file(victim, buf, 1000));
		ino = ino_of(victim);
		plant(victim, NOBODY);
		T_ERR(save(h, how, 2), -EACCES);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(h, &e), -EACCES);
		T_TRUE(strstr(e.what, "protected_symlinks") != NULL);
		T_TRUE(strcmp(e.path, link_path) == 0);
		check_victim(1000, 1);
		T_EQ_U64(ino_of(victim), ino);
		T_EQ_INT(entries(), 2);		/* victim and the sticky dir */

		t_ctx("%s other user's dangling link, %s save", t_combo(), hows[how]);
		unlink(victim);
		T_ERR(save(h, how, 3), -EACCES);
		T_EQ_INT(entries(), 1);		/* nothing made where it points */
	}
}

static void followed(nvio_handle_t *h)
{
	static const char *const hows[] = { "plain", "spare", "write_file" };
	struct stat st;

	for (int how = 0; how < 3; how++) {
		t_ctx("%s own link, %s save", t_combo(), hows[how]);
		t_fill_random(buf, 1000, 1);
		T_OK(t_write_file(victim, buf, 1000));
		plant(victim, 0);
		T_OK(save(h, how, 10 + (uint64_t)how));
		T_OK(save(h, how, 20 + (uint64_t)how));	/* a spare now, for "spare" */
		check_victim(N, 20 + (uint64_t)how);
		T_TRUE(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));

		t_ctx("%s own dangling link, %s save", t_combo(), hows[how]);
		unlink(victim);
		T_OK(save(h, how, 30 + (uint64_t)how));
		check_victim(N, 30 + (uint64_t)how);
		T_TRUE(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
		unlink(victim);
		{
			char sp[T_PATH_MAX];

			snprintf(sp, sizeof(sp), "%s/.victim.nvio-spare", victim_dir);
			unlink(sp);
		}
	}
	t_ctx("%s other user's link, protected_symlinks off", t_combo());
	if (write_sysctl(0) == 0) {
		t_fill_random(buf, 1000, 1);
		T_OK(t_write_file(victim, buf, 1000));
		plant(victim, NOBODY);
		T_OK(save(h, 0, 40));		/* as open(2) would: followed */
		check_victim(N, 40);
		T_OK(write_sysctl(1));
		unlink(victim);
	}
	unlink(link_path);
}

int main(void)
{
	t_init("symlink_rules");
	if (geteuid() != 0)
		t_skip("a link owned by another user needs root");
	old_sysctl = read_sysctl();
	if (old_sysctl < 0)
		t_skip("no %s", SYSCTL);
	atexit(restore_sysctl);
	if (old_sysctl != 1 && write_sysctl(1) < 0)
		t_skip("protected_symlinks is off and cannot be set");
	buf = t_alloc(N);
	back = t_alloc(N);
	snprintf(victim_dir, sizeof(victim_dir), "%s", t_tmpdir());
	t_subdir(sticky, "sticky");
	T_OK(chmod(sticky, 01777) < 0 ? -errno : 0);
	t_path(victim, "victim");
	snprintf(link_path, sizeof(link_path), "%s/ck.pt", sticky);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 0))
			continue;
		refused(h);
		followed(h);
		nvio_handle_destroy(h);
	}
	free(buf);
	free(back);
	return t_done();
}

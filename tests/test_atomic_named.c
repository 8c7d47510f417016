/*
 * test_atomic_named.c - atomic writes where the file system has no
 * O_TMPFILE (NFS, older kernels): the data goes to an exclusive hidden
 * temporary beside the target, which commit renames over it and abandon
 * removes. O_TMPFILE is refused through the system-call table. Checks:
 * the target keeps its old bytes until commit, the new bytes after, its
 * mode bits are kept, and no temporary is left in the directory either
 * way; nvio_file_temp_path names the temporary until the commit; a
 * symbolic link planted at a temporary-like name is never
 * followed. On every engine, direct on and off.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N ((1u << 20) + 333)

static int no_tmpfile(const char *path, int flags, mode_t mode)
{
	if ((flags & O_TMPFILE) == O_TMPFILE) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return open(path, flags, mode);
}

/* Entries of dir other than . and .. */
static int entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (d)
		closedir(d);
	return n;
}

static void one(int engine, int direct, unsigned char *old, unsigned char *nu,
		unsigned char *back)
{
	char path[T_PATH_MAX], dir[T_PATH_MAX], bait[T_PATH_MAX], victim[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *f;
	struct stat st;
	int err, before;

	if (t_handle(&h, engine, direct, 2, 0))
		return;
	t_path(path, "target");
	t_path(victim, "victim");
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = 0;
	T_OK(t_write_file(path, old, N));
	T_OK(t_write_file(victim, old, 100));
	chmod(path, 0640);
	/* a link at a name like ours: exclusive creation never follows it */
	snprintf(bait, sizeof(bait), "%s/.target.nvio-0000000000000000", dir);
	T_OK(symlink(victim, bait) < 0 ? -errno : 0);
	before = entries(dir);
	nvio__sys.open = no_tmpfile;
	for (int commit = 0; commit < 2; commit++) {
		t_ctx("%s %s", t_combo(), commit ? "commit" : "abandon");
		f = nvio_file_open(h, path, NVIO_FILE_ATOMIC, &err);
		if (!T_TRUE(f != NULL))
			continue;
		T_EQ_INT(entries(dir), before + 1);	/* a named temporary */
		{
			const char *tp = nvio_file_temp_path(f);
			nvio_file_info_t info = { .struct_size = sizeof(info) };
			struct stat a, b;

			/* its name leads to the file being written */
			if (T_TRUE(tp != NULL) && T_OK(nvio_file_info(f, &info)) &&
			    T_OK(lstat(tp, &a) < 0 ? -errno : 0) &&
			    T_OK(fstat(info.fd, &b) < 0 ? -errno : 0))
				T_EQ_U64(a.st_ino, b.st_ino);
		}
		T_OK(nvio_file_pwrite(f, nu, N, 0, 0));
		memset(back, 0, N);
		T_OK(t_pread_file(path, back, N, 0));
		T_MEM_EQ(back, old, N);			/* untouched so far */
		if (commit) {
			T_OK(nvio_file_commit(f));
			T_TRUE(nvio_file_temp_path(f) == NULL);
		}
		T_OK(nvio_file_close(f));
		T_EQ_INT(entries(dir), before);
		memset(back, 0, N);
		T_OK(t_pread_file(path, back, N, 0));
		T_MEM_EQ(back, commit ? nu : old, N);
	}
	/* a whole-file write takes the same path */
	t_ctx("%s write_file", t_combo());
	T_OK(nvio_write_file(h, old, N, path, NVIO_FSYNC));
	nvio__sys_reset();
	T_EQ_INT(entries(dir), before);
	memset(back, 0, N);
	T_OK(t_pread_file(path, back, N, 0));
	T_MEM_EQ(back, old, N);
	if (T_OK(stat(path, &st) < 0 ? -errno : 0))
		T_EQ_INT(st.st_mode & 07777, 0640);
	memset(back, 0, 100);
	T_OK(t_pread_file(victim, back, 100, 0));
	T_MEM_EQ(back, old, 100);			/* the link's target */
	unlink(bait);
	unlink(victim);
	unlink(path);
	nvio_handle_destroy(h);
}

int main(void)
{
	unsigned char *old, *nu, *back;

	t_init("atomic_named");
	old = t_alloc(N);
	nu = t_alloc(N);
	back = t_alloc(N);
	t_fill_random(old, N, 1);
	t_fill_random(nu, N, 2);
	T_FOR_EACH_COMBO(e, d) {
		one(e, d, old, nu, back);
	}
	free(old);
	free(nu);
	free(back);
	return t_done();
}

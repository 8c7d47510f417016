/*
 * test_shared_file.c - one atomic file written by several processes
 * (NVIO_FILE_SHARED, nvio_file_share, nvio_file_join). The creator makes
 * the named temporary, forked writers join it and write their shares,
 * the creator commits or abandons. Checks: every share lands, byte for
 * byte; nothing is visible at the target before the commit; abandon
 * leaves the old file and no temporary; a writer's failure comes back as
 * its own errno; join refuses a symbolic link, a FIFO (without
 * blocking), another user's file, a file of two names, a file other than
 * the creator's, a name that is no temporary's, bad shares and flags;
 * faults: ENOSPC at the creator's and a writer's allocation, EIO at the
 * commit's fsync. On every engine, direct on and off.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N ((3u << 20) + 4097)	/* shares cut off the block boundaries */
#define WRITERS 3

static unsigned char *old, *nu, *back;

/* [*off, *off + *len) of the file, the share of writer i of n. */
static void share_of(int i, int n, uint64_t *off, uint64_t *len)
{
	*off = (uint64_t)N * (unsigned)i / (unsigned)n;
	*len = (uint64_t)N * (unsigned)(i + 1) / (unsigned)n - *off;
}

static ssize_t eio_writes(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	return is_write ? -EIO : res;
}

/*
 * A writer in a child (this program run again with --writer): its own handle, joins, writes its share, closes.
 * Exits 0, or with the negated errno of the step that failed (fail: an
 * EIO on every write, through the table).
 */
static void writer(int engine, int direct, const char *tmp, const nvio_share_t *sh,
		   int i, int n, int fail)
{
	nvio_config_t c;
	nvio_handle_t *h;
	nvio_file_t *f;
	uint64_t off, len;
	int err;

	t_config(&c, engine, direct, 0, 0);
	err = nvio_handle_create(&h, &c);
	if (err)
		_exit(-err);
	if (fail)
		nvio__sys.io_result = eio_writes;
	f = nvio_file_join(h, tmp, sh, NVIO_FILE_WRITE, &err);
	if (!f)
		_exit(-err);
	share_of(i, n, &off, &len);
	err = nvio_file_pwrite(f, nu + off, len, (int64_t)off, 0);
	if (!err)
		err = nvio_file_close(f);
	else
		nvio_file_close(f);
	nvio_handle_destroy(h);
	_exit(-err);
}

/* Forks writers 1 .. WRITERS - 1 (the creator writes share 0); returns
 * the first nonzero exit status as -errno, or 0. fail_one: writer 1 fails. */
static int run_writers(int engine, int direct, const char *tmp, const nvio_share_t *sh,
		       int fail_one)
{
	pid_t pids[WRITERS];
	int first = 0, st;

	for (int i = 1; i < WRITERS; i++) {
		char a[8][32];

		snprintf(a[0], 32, "%llu", (unsigned long long)sh->dev);
		snprintf(a[1], 32, "%llu", (unsigned long long)sh->ino);
		snprintf(a[2], 32, "%d", i);
		snprintf(a[3], 32, "%d", WRITERS);
		snprintf(a[4], 32, "%d", fail_one && i == 1);
		snprintf(a[5], 32, "%d", engine);
		snprintf(a[6], 32, "%d", direct);
		pids[i] = fork();
		if (pids[i] == 0) {	/* a fresh process (TSan: no threads after fork) */
			execl("/proc/self/exe", "test_shared_file", "--writer", tmp, a[0], a[1],
			      a[2], a[3], a[4], a[5], a[6], (char *)NULL);
			_exit(127);
		}
	}
	for (int i = 1; i < WRITERS; i++) {
		if (pids[i] < 0 || waitpid(pids[i], &st, 0) < 0) {
			T_FAILF("fork/wait of writer %d", i);
			continue;
		}
		if (!WIFEXITED(st))
			T_FAILF("writer %d killed", i);
		else if (WEXITSTATUS(st) && !first)
			first = -WEXITSTATUS(st);
	}
	return first;
}

static void check_target(const char *path, const unsigned char *want)
{
	memset(back, 0, N);
	T_EQ_INT(t_file_size(path), N);
	T_OK(t_pread_file(path, back, N, 0));
	T_MEM_EQ(back, want, N);
}

/* commit: 1 commit, 0 abandon, 2 writer 1 fails (the creator abandons). */
static void shares(int engine, int direct, int commit)
{
	char path[T_PATH_MAX], dir[T_PATH_MAX];
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	nvio_handle_t *h;
	nvio_file_t *f;
	uint64_t off, len;
	int err, before;

	t_ctx("%s %s", t_combo(), commit == 1 ? "commit" : commit ? "writer fails" : "abandon");
	if (t_handle(&h, engine, direct, 2, 0))
		return;
	t_path(path, "target");
	snprintf(dir, sizeof(dir), "%s", t_tmpdir());
	T_OK(t_write_file(path, old, N));
	before = t_dir_count(dir);
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	if (!T_TRUE(f != NULL)) {
		nvio_handle_destroy(h);
		return;
	}
	T_TRUE(nvio_file_temp_path(f) != NULL);	/* named, even with O_TMPFILE */
	T_OK(nvio_file_share(f, &sh));
	T_OK(nvio_file_allocate(f, 0, N));
	T_EQ_INT(run_writers(engine, direct, nvio_file_temp_path(f), &sh, commit == 2),
		 commit == 2 ? -EIO : 0);
	share_of(0, WRITERS, &off, &len);
	T_OK(nvio_file_pwrite(f, nu + off, len, (int64_t)off, 0));
	T_EQ_INT(t_dir_count(dir), before + 1);
	check_target(path, old);			/* nothing visible yet */
	if (commit == 1) {
		T_OK(nvio_file_commit(f));
		T_ERR(nvio_file_share(f, &sh), -EINVAL);	/* committed */
	}
	T_OK(nvio_file_close(f));
	T_EQ_INT(t_dir_count(dir), before);		/* no temporary left */
	check_target(path, commit == 1 ? nu : old);
	unlink(path);
	nvio_handle_destroy(h);
}

static uid_t fake_uid;
static int other_owner(int fd, struct stat *st)
{
	int r = fstat(fd, st);

	if (r == 0)
		st->st_uid = fake_uid;
	return r;
}

/* A file at a temporary-like name, made by hand; returns its identity. */
static nvio_share_t plant(const char *name)
{
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	struct stat st;

	T_OK(t_write_file(name, old, 100));
	if (T_OK(stat(name, &st) < 0 ? -errno : 0)) {
		sh.dev = st.st_dev;
		sh.ino = st.st_ino;
	}
	return sh;
}

/* What join refuses, and the argument checks of the new calls. */
static void refusals(void)
{
	char name[T_PATH_MAX], other[T_PATH_MAX], link2[T_PATH_MAX], victim[T_PATH_MAX];
	nvio_share_t sh, bad;
	nvio_handle_t *h;
	nvio_file_t *f;
	int err;

	t_ctx("refusals");
	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 1, 0))
		return;
	t_path(name, ".t.nvio-0000000100000001-1-1-00000001");
	t_path(other, "plain");
	t_path(victim, "victim");
	sh = plant(name);
	/* the file itself joins, and is a plain file */
	f = nvio_file_join(h, name, &sh, NVIO_FILE_WRITE | NVIO_FILE_READ, &err);
	if (T_TRUE(f != NULL)) {
		T_OK(err);
		T_ERR(nvio_file_commit(f), -EINVAL);
		T_ERR(nvio_file_share(f, &bad), -EINVAL);
		T_OK(nvio_file_close(f));
		T_EQ_INT(t_file_size(name), 100);	/* kept, not truncated */
	}
	/* bad arguments */
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_READ, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE | NVIO_FILE_ATOMIC, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_join(h, name, NULL, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_join(NULL, name, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	bad = sh;
	bad.reserved[2] = 1;
	T_TRUE(nvio_file_join(h, name, &bad, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	bad = sh;
	bad.struct_size = 16;				/* ino not covered */
	T_TRUE(nvio_file_join(h, name, &bad, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	/* a file other than the creator's at the name */
	bad = sh;
	bad.ino++;
	T_TRUE(nvio_file_join(h, name, &bad, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -ESTALE);
	/* a name that is no temporary's, even of the right file */
	T_OK(rename(name, other) < 0 ? -errno : 0);
	T_TRUE(nvio_file_join(h, other, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_OK(rename(other, name) < 0 ? -errno : 0);
	/* a file of two names */
	t_path(link2, "second-name");
	T_OK(link(name, link2) < 0 ? -errno : 0);
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EPERM);
	unlink(link2);
	/* another user's file (fstat says so, through the table) */
	fake_uid = geteuid() + 1;
	nvio__sys.fstat = other_owner;
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EPERM);
	nvio__sys_reset();
	/* the open with SHARED but not ATOMIC: the same refusals, no identity */
	f = nvio_file_open(h, name, NVIO_FILE_WRITE | NVIO_FILE_SHARED, &err);
	if (T_TRUE(f != NULL)) {
		T_ERR(nvio_file_commit(f), -EINVAL);
		T_OK(nvio_file_close(f));
		T_EQ_INT(t_file_size(name), 100);
	}
	T_TRUE(nvio_file_open(h, name, NVIO_FILE_SHARED, &err) == NULL);	/* no WRITE */
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_open(h, name, NVIO_FILE_WRITE | NVIO_FILE_SHARED | NVIO_FILE_TRUNC,
			      &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_open(h, other, NVIO_FILE_WRITE | NVIO_FILE_SHARED, &err) == NULL);
	T_EQ_INT(err, -EINVAL);		/* no temporary's name (and nothing there) */
	/* a symbolic link at the name: refused, its target untouched */
	T_OK(t_write_file(victim, old, 100));
	unlink(name);
	T_OK(symlink(victim, name) < 0 ? -errno : 0);
	sh = plant(victim);
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -ELOOP);
	T_TRUE(nvio_file_open(h, name, NVIO_FILE_WRITE | NVIO_FILE_SHARED, &err) == NULL);
	T_EQ_INT(err, -ELOOP);
	unlink(name);
	/* a FIFO: refused without blocking (no reader, then a reader-writer open) */
	T_OK(mkfifo(name, 0600) < 0 ? -errno : 0);
	{
		struct stat st;

		if (T_OK(stat(name, &st) < 0 ? -errno : 0)) {
			sh.dev = st.st_dev;
			sh.ino = st.st_ino;
		}
	}
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_file_join(h, name, &sh, NVIO_FILE_WRITE | NVIO_FILE_READ, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	unlink(name);
	/* SHARED needs ATOMIC; share needs a SHARED file */
	T_TRUE(nvio_file_open(h, other, NVIO_FILE_WRITE | NVIO_FILE_CREATE | NVIO_FILE_SHARED,
			      &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	f = nvio_file_open(h, other, NVIO_FILE_ATOMIC, &err);
	if (T_TRUE(f != NULL)) {
		T_ERR(nvio_file_share(f, &bad), -EINVAL);
		nvio_file_close(f);
	}
	unlink(victim);
	nvio_handle_destroy(h);
}

static int enospc_fallocate(int fd, int mode, off_t off, off_t len)
{
	errno = ENOSPC;
	return -1;
}

static int eio_fsync(int fd)
{
	errno = EIO;
	return -1;
}

/* Faults: the old file stays and no temporary is left. */
static void faults(void)
{
	char path[T_PATH_MAX], dir[T_PATH_MAX];
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	nvio_handle_t *h;
	nvio_file_t *f, *w;
	int err, before;

	t_ctx("faults");
	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 1, 0))
		return;
	t_path(path, "target");
	snprintf(dir, sizeof(dir), "%s", t_tmpdir());
	T_OK(t_write_file(path, old, N));
	before = t_dir_count(dir);
	/* ENOSPC at the creator's allocation, then at a writer's growth */
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	if (T_TRUE(f != NULL)) {
		T_OK(nvio_file_share(f, &sh));
		nvio__sys.fallocate = enospc_fallocate;
		T_ERR(nvio_file_allocate(f, 0, N), -ENOSPC);
		w = nvio_file_join(h, nvio_file_temp_path(f), &sh, NVIO_FILE_WRITE, &err);
		if (T_TRUE(w != NULL)) {
			T_ERR(nvio_file_pwrite(w, nu, N, 0, 0), -ENOSPC);
			T_OK(nvio_file_close(w));
		}
		nvio__sys_reset();
		nvio_file_close(f);
	}
	T_EQ_INT(t_dir_count(dir), before);
	check_target(path, old);
	/* EIO at the commit's fsync: no commit */
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	if (T_TRUE(f != NULL)) {
		T_OK(nvio_file_share(f, &sh));
		w = nvio_file_join(h, nvio_file_temp_path(f), &sh, NVIO_FILE_WRITE, &err);
		if (T_TRUE(w != NULL)) {
			T_OK(nvio_file_pwrite(w, nu, N, 0, 0));
			T_OK(nvio_file_close(w));
		}
		T_OK(nvio_file_truncate(f, N));
		nvio__sys.fsync = eio_fsync;
		T_ERR(nvio_file_commit(f), -EIO);
		nvio__sys_reset();
		nvio_file_close(f);
	}
	T_EQ_INT(t_dir_count(dir), before);
	check_target(path, old);
	unlink(path);
	nvio_handle_destroy(h);
}

int main(int argc, char **argv)
{
	if (argc == 10 && !strcmp(argv[1], "--writer")) {
		nvio_share_t sh = { .struct_size = sizeof(sh) };

		nu = t_alloc(N);
		t_fill_random(nu, N, 2);
		sh.dev = strtoull(argv[3], NULL, 10);
		sh.ino = strtoull(argv[4], NULL, 10);
		writer(atoi(argv[8]), atoi(argv[9]), argv[2], &sh, atoi(argv[5]), atoi(argv[6]),
		       atoi(argv[7]));
	}
	t_init("shared_file");
	old = t_alloc(N);
	nu = t_alloc(N);
	back = t_alloc(N);
	t_fill_random(old, N, 1);
	t_fill_random(nu, N, 2);
	T_FOR_EACH_COMBO(e, d) {
		for (int commit = 0; commit < 3; commit++)
			shares(e, d, commit);
	}
	refusals();
	faults();
	free(old);
	free(nu);
	free(back);
	return t_done();
}

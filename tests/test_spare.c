/*
 * test_spare.c - NVIO_FILE_SPARE: atomic writes into the blocks of the
 * target's previous version. Checks, on every engine with direct I/O on
 * and off: the first save of a new target leaves no spare; the second
 * makes one (the old target's inode becomes the spare); later saves
 * reuse it (the spare's inode becomes the target, the old target's the
 * spare), shrinking and growing with exact sizes and bytes; abandon
 * leaves the target's bytes and inode alone and keeps the spare, free
 * for the next save even while its I/O descriptor is still held; NOSYNC
 * commits too; a second writer opening the spare by its name
 * (nvio_file_temp_path) writes part of the same save. A spare that is hard-linked, a symbolic link, or locked by
 * another writer is never written (the save falls back to an ordinary
 * temporary); RENAME_EXCHANGE refused falls back to a plain rename; a
 * fault injected at flock, ftruncate, fsync or renameat2 either falls
 * back or fails the commit with that errno, the target unchanged and no
 * stray temporary. The sweep of temporaries never removes a spare;
 * NVIO_CLEAN_SPARES removes one whose target is gone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define MAXN ((3u << 20) + 777)

static unsigned char *buf, *back;
static char dir[T_PATH_MAX], target[T_PATH_MAX], spare[T_PATH_MAX];
static int fail_errno;
static int fail_calls;

/* Entries of dir other than . and .. */
static int entries(void)
{
	return t_dir_count(dir);
}

static ino_t ino_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? st.st_ino : 0;
}

/* path holds exactly n bytes of the stream seed. */
static void check_file(const char *path, size_t n, uint64_t seed)
{
	size_t size = 0;

	if (!T_OK(t_read_file(path, back, MAXN, &size)))
		return;
	if (T_EQ_U64(size, n))
		T_EQ_INT(t_check_random_at(back, n, seed, 0), -1);
}

/* An atomic save of n bytes of stream seed through h with flags. */
static int save(nvio_handle_t *h, unsigned flags, size_t n, uint64_t seed, int commit)
{
	nvio_file_t *f;
	int err = 0, r;

	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | flags, &err);
	if (!f)
		return err;
	t_fill_random(buf, n, seed);
	r = nvio_file_pwrite(f, buf, n, 0, 0);
	if (!r && commit)
		r = nvio_file_commit(f);
	if (nvio_file_close(f) < 0 && !r)
		r = -EIO;
	return r;
}

static int h_flock(int fd, int op)
{
	fail_calls++;
	errno = fail_errno;
	return -1;
}

static int h_ftruncate(int fd, off_t len)
{
	fail_calls++;
	errno = fail_errno;
	return -1;
}

static int h_fsync(int fd)
{
	fail_calls++;
	errno = fail_errno;
	return -1;
}

static int h_renameat2(int a, const char *pa, int b, const char *pb, unsigned fl)
{
	fail_calls++;
	errno = fail_errno;
	return -1;
}

static void arm(int err)
{
	fail_errno = err;
	fail_calls = 0;
}

/* The three saves: none, a new spare, a reused one; shrink and grow. */
static void cycle(nvio_handle_t *h)
{
	nvio_file_t *f;
	ino_t t0, t1, s1;
	int err;

	t_ctx("%s first save", t_combo());
	T_OK(save(h, NVIO_FILE_SPARE, MAXN, 1, 1));
	check_file(target, MAXN, 1);
	T_EQ_INT(entries(), 1);			/* no spare from a new target */
	t0 = ino_of(target);

	t_ctx("%s second save", t_combo());
	T_OK(save(h, NVIO_FILE_SPARE, MAXN - 5000, 2, 1));
	check_file(target, MAXN - 5000, 2);
	T_EQ_INT(entries(), 2);
	T_EQ_U64(ino_of(spare), t0);		/* the old version is the spare */
	t1 = ino_of(target);
	T_TRUE(t1 != t0);

	t_ctx("%s third save (shrink)", t_combo());
	T_OK(save(h, NVIO_FILE_SPARE, 4096 + 17, 3, 1));
	check_file(target, 4096 + 17, 3);	/* no stale bytes past the end */
	T_EQ_U64(ino_of(target), t0);		/* the spare's blocks were used */
	T_EQ_U64(ino_of(spare), t1);
	T_EQ_INT(entries(), 2);

	t_ctx("%s fourth save (grow, NOSYNC)", t_combo());
	s1 = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE | NVIO_FILE_NOSYNC, MAXN, 4, 1));
	check_file(target, MAXN, 4);
	T_EQ_U64(ino_of(target), s1);
	T_EQ_U64(ino_of(spare), t0);

	t_ctx("%s abandon", t_combo());
	t1 = ino_of(target);
	s1 = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE, 8192, 5, 0));
	check_file(target, MAXN, 4);
	T_EQ_U64(ino_of(target), t1);
	T_EQ_U64(ino_of(spare), s1);		/* kept as the spare */
	T_EQ_INT(entries(), 2);

	/*
	 * An abandoned save whose I/O descriptor outlives its close (the
	 * kernel can hold the file an io_uring or aio request used for a
	 * while; a dup here): the spare is free again all the same, and the
	 * next save writes it rather than an ordinary temporary.
	 */
	t_ctx("%s abandon, its I/O descriptor still held", t_combo());
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (T_TRUE(f != NULL)) {
		nvio_file_info_t info = { .struct_size = sizeof(info) };
		int held = -1;

		t_fill_random(buf, 8192, 5);
		T_OK(nvio_file_pwrite(f, buf, 8192, 0, 0));
		if (T_OK(nvio_file_info(f, &info)))
			held = dup(info.fd);
		T_TRUE(held >= 0);
		T_OK(nvio_file_close(f));
		T_EQ_U64(ino_of(spare), s1);

		t_ctx("%s after abandon", t_combo());
		T_OK(save(h, NVIO_FILE_SPARE, 100000, 6, 1));
		if (held >= 0)
			close(held);
	}
	check_file(target, 100000, 6);
	T_EQ_U64(ino_of(target), s1);		/* the spare was used */
	T_EQ_U64(ino_of(spare), t1);

	/* the spare is 0600 while written (it had the old target's bits,
	 * here readable by all); the new target gets the old one's */
	t_ctx("%s modes", t_combo());
	chmod(target, 0640);
	chmod(spare, 0644);
	s1 = ino_of(spare);
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (T_TRUE(f != NULL)) {
		struct stat st;

		if (T_OK(lstat(spare, &st) < 0 ? -errno : 0))
			T_EQ_INT(st.st_mode & 07777, 0600);
		t_fill_random(buf, 4096, 7);
		T_OK(nvio_file_pwrite(f, buf, 4096, 0, 0));
		T_OK(nvio_file_commit(f));
		T_OK(nvio_file_close(f));
		if (T_OK(lstat(target, &st) < 0 ? -errno : 0))
			T_EQ_INT(st.st_mode & 07777, 0640);
		T_EQ_U64(st.st_ino, s1);
		check_file(target, 4096, 7);
	}
	chmod(target, 0644);
}

/*
 * Two writers of one save (ranks of a data-parallel save): the spare is
 * named (nvio_file_temp_path), a second file opened by that name writes
 * the second half, the commit puts both halves in place. An unnamed
 * temporary (a new target, no spare) has no name to give.
 */
static void shared(nvio_handle_t *h)
{
	nvio_file_t *f, *g;
	size_t half = MAXN / 2 / 4096 * 4096;
	ino_t s = ino_of(spare);
	const char *tp;
	int err;

	t_ctx("%s two writers", t_combo());
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (!T_TRUE(f != NULL))
		return;
	tp = nvio_file_temp_path(f);
	if (T_TRUE(tp != NULL))
		T_EQ_INT(strcmp(tp, spare), 0);
	t_fill_random(buf, MAXN, 30);
	T_OK(nvio_file_pwrite(f, buf, half, 0, 0));
	g = tp ? nvio_file_open(h, tp, NVIO_FILE_WRITE, &err) : NULL;
	if (T_TRUE(g != NULL)) {
		T_OK(nvio_file_pwrite(g, buf + half, MAXN - half, (int64_t)half, 0));
		T_OK(nvio_file_sync(g));
		T_OK(nvio_file_close(g));
	}
	T_OK(nvio_file_pwrite(f, buf + MAXN - 10, 10, MAXN - 10, 0));	/* the end, as rank 0 */
	T_OK(nvio_file_commit(f));
	T_TRUE(nvio_file_temp_path(f) == NULL);
	T_OK(nvio_file_close(f));
	check_file(target, MAXN, 30);
	T_EQ_U64(ino_of(target), s);

	t_ctx("%s no name without a spare", t_combo());
	unlink(target);
	unlink(spare);
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (T_TRUE(f != NULL)) {
		T_TRUE(nvio_file_temp_path(f) == NULL);		/* O_TMPFILE */
		T_OK(nvio_file_close(f));
	}
	T_TRUE(nvio_file_temp_path(NULL) == NULL);
	T_OK(save(h, NVIO_FILE_SPARE, MAXN, 31, 1));		/* as cycle() left them */
	T_OK(save(h, NVIO_FILE_SPARE, MAXN, 32, 1));
	T_EQ_INT(entries(), 2);
}

/* Spares that must not be written: the save falls back, leaves them. */
static void refused(nvio_handle_t *h)
{
	char other[T_PATH_MAX], victim[T_PATH_MAX];
	ino_t s;
	int fd;

	t_path(other, "other");
	t_path(victim, "victim");

	t_ctx("%s hard-linked spare", t_combo());
	T_OK(link(spare, other) < 0 ? -errno : 0);
	s = ino_of(spare);
	{
		size_t n = 0;
		unsigned char *keep = t_alloc(MAXN);

		T_OK(t_read_file(other, keep, MAXN, &n));
		T_OK(save(h, NVIO_FILE_SPARE, 70000, 7, 1));
		check_file(target, 70000, 7);
		T_EQ_U64(ino_of(spare), s);	/* untouched, still there */
		T_TRUE(ino_of(target) != s);
		if (T_OK(t_read_file(other, back, MAXN, &n)))
			T_MEM_EQ(back, keep, n);
		free(keep);
	}
	unlink(other);
	T_EQ_INT(entries(), 2);

	t_ctx("%s symlinked spare", t_combo());
	unlink(spare);
	T_OK(t_write_file(victim, buf, 1000));
	T_OK(symlink(victim, spare) < 0 ? -errno : 0);
	t_fill_random(back, 1000, 99);
	T_OK(t_write_file(victim, back, 1000));
	T_OK(save(h, NVIO_FILE_SPARE, 80000, 8, 1));
	check_file(target, 80000, 8);
	check_file(victim, 1000, 99);
	{
		struct stat st;

		T_TRUE(lstat(spare, &st) == 0 && S_ISLNK(st.st_mode));
	}
	unlink(spare);
	unlink(victim);
	T_EQ_INT(entries(), 1);

	/* a new spare again (second save), then hold it as another writer */
	T_OK(save(h, NVIO_FILE_SPARE, 5000, 9, 1));
	T_EQ_INT(entries(), 2);
	t_ctx("%s spare locked by another writer", t_combo());
	fd = open(spare, O_RDONLY);
	T_TRUE(fd >= 0);
	T_OK(flock(fd, LOCK_EX | LOCK_NB) < 0 ? -errno : 0);
	s = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE, 90000, 10, 1));
	check_file(target, 90000, 10);
	T_EQ_U64(ino_of(spare), s);
	T_TRUE(ino_of(target) != s);
	check_file(spare, 80000, 8);		/* the old version, unwritten */
	close(fd);
	T_EQ_INT(entries(), 2);
}

/* Injected faults: fallbacks, or a failed commit with the target intact. */
static void faults(nvio_handle_t *h)
{
	static const int errs[] = { -EIO, -ENOSPC };
	ino_t t, s;

	/* a spare to work with */
	T_OK(save(h, NVIO_FILE_SPARE, 60000, 11, 1));
	T_EQ_INT(entries(), 2);

	t_ctx("%s flock fails", t_combo());
	arm(EIO);
	nvio__sys.flock = h_flock;
	s = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE, 50000, 12, 1));
	nvio__sys_reset();
	T_TRUE(fail_calls > 0);
	check_file(target, 50000, 12);
	T_EQ_U64(ino_of(spare), s);		/* not used: an ordinary temporary */
	T_TRUE(ino_of(target) != s);
	T_EQ_INT(entries(), 2);

	t_ctx("%s RENAME_EXCHANGE refused", t_combo());
	arm(EINVAL);
	nvio__sys.renameat2 = h_renameat2;
	s = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE, 40000, 13, 1));
	nvio__sys_reset();
	T_EQ_INT(fail_calls, 1);
	check_file(target, 40000, 13);
	T_EQ_U64(ino_of(target), s);		/* the spare, renamed */
	T_EQ_INT(entries(), 1);			/* consumed */

	/* a spare again */
	T_OK(save(h, NVIO_FILE_SPARE, 30000, 14, 1));
	T_EQ_INT(entries(), 2);
	for (int step = 0; step < 3; step++) {
		static const char *const names[] = { "ftruncate", "fsync", "renameat2" };

		for (size_t e = 0; e < sizeof(errs) / sizeof(errs[0]); e++) {
			t_ctx("%s %s fails with %s", t_combo(), names[step], t_errname(errs[e]));
			t = ino_of(target);
			s = ino_of(spare);
			arm(-errs[e]);
			if (step == 0)
				nvio__sys.ftruncate = h_ftruncate;
			else if (step == 1)
				nvio__sys.fsync = h_fsync;
			else
				nvio__sys.renameat2 = h_renameat2;
			T_ERR(save(h, NVIO_FILE_SPARE, 20000, 15, 1), errs[e]);
			nvio__sys_reset();
			T_TRUE(fail_calls > 0);
			check_file(target, 30000, 14);	/* the old version */
			T_EQ_U64(ino_of(target), t);
			T_EQ_U64(ino_of(spare), s);	/* still the spare */
			T_EQ_INT(entries(), 2);		/* nothing stray */
		}
	}
	t_ctx("%s after faults", t_combo());
	t = ino_of(target);
	s = ino_of(spare);
	T_OK(save(h, NVIO_FILE_SPARE, 25000, 16, 1));
	check_file(target, 25000, 16);
	T_EQ_U64(ino_of(target), s);
	T_EQ_U64(ino_of(spare), t);
}

/* A spare reads as empty past what was written; the sweeps. */
static void misc(nvio_handle_t *h)
{
	nvio_file_t *f;
	int err;

	t_ctx("%s read past the written end", t_combo());
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_READ | NVIO_FILE_SPARE, &err);
	if (T_TRUE(f != NULL)) {
		t_fill_random(buf, 100, 17);
		T_OK(nvio_file_pwrite(f, buf, 100, 0, 0));
		T_ERR(nvio_file_pread(f, back, 200, 0, 0), -ENODATA);
		T_OK(nvio_file_close(f));
	}
	/* no target, a spare there: its blocks, renamed into place */
	t_ctx("%s spare without a target", t_combo());
	{
		struct stat st;
		ino_t s = ino_of(spare);

		unlink(target);
		T_OK(save(h, NVIO_FILE_SPARE, 12345, 18, 1));
		check_file(target, 12345, 18);
		T_EQ_U64(ino_of(target), s);
		T_EQ_INT(entries(), 1);		/* used up: no spare made */
		if (T_OK(lstat(target, &st) < 0 ? -errno : 0))
			T_EQ_INT(st.st_mode & 07777, 0644);	/* 0666 less umask 022 */
		T_OK(save(h, NVIO_FILE_SPARE, 2345, 19, 1));	/* a spare again */
		T_EQ_INT(entries(), 2);
	}
	/* a name too long for a spare beside it: ordinary saves */
	t_ctx("%s long name", t_combo());
	{
		char name[250], path[T_PATH_MAX];
		nvio_file_t *lf;

		memset(name, 'n', sizeof(name) - 1);
		name[sizeof(name) - 1] = 0;
		snprintf(path, sizeof(path), "%s/%s", dir, name);	/* t_path cuts at 200 */
		T_OK(t_write_file(path, buf, 10));
		for (int i = 0; i < 3; i++) {
			lf = nvio_file_open(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
			if (!T_TRUE(lf != NULL))
				break;
			t_fill_random(buf, 5000, 20 + i);
			T_OK(nvio_file_pwrite(lf, buf, 5000, 0, 0));
			T_OK(nvio_file_commit(lf));
			T_OK(nvio_file_close(lf));
			check_file(path, 5000, 20 + i);
		}
		T_EQ_INT(entries(), 3);		/* target, its spare, the long one */
		unlink(path);
	}
	t_ctx("%s sweeps", t_combo());
	T_EQ_INT(nvio_clean_temporaries(dir, NULL, 0, NULL, NULL), 0);
	T_EQ_INT(nvio_clean_temporaries(dir, NULL, NVIO_CLEAN_SPARES, NULL, NULL), 0);
	T_EQ_INT(entries(), 2);
	unlink(target);
	T_EQ_INT(nvio_clean_temporaries(dir, NULL, NVIO_CLEAN_SPARES | NVIO_CLEAN_DRY_RUN,
					NULL, NULL), 1);
	T_EQ_INT(entries(), 1);
	T_EQ_INT(nvio_clean_temporaries(dir, "target", NVIO_CLEAN_SPARES, NULL, NULL), 1);
	T_EQ_INT(entries(), 0);
}

static void one(int engine, int direct)
{
	nvio_handle_t *h;

	if (t_handle(&h, engine, direct, 2, 0))
		return;
	cycle(h);
	shared(h);
	refused(h);
	faults(h);
	misc(h);
	unlink(target);
	unlink(spare);
	nvio_handle_destroy(h);
}

int main(void)
{
	nvio_handle_t *h;
	int err;

	t_init("spare");
	umask(022);
	buf = t_alloc(MAXN);
	back = t_alloc(MAXN);
	t_path(target, "target");
	t_path(spare, ".target.nvio-spare");
	snprintf(dir, sizeof(dir), "%s", t_tmpdir());

	t_ctx("flags");
	if (T_OK(nvio_handle_create(&h, NULL))) {
		T_TRUE(nvio_file_open(h, target, NVIO_FILE_WRITE | NVIO_FILE_CREATE |
				      NVIO_FILE_SPARE, &err) == NULL);
		T_EQ_INT(err, -EINVAL);
		T_EQ_INT(nvio_clean_temporaries(dir, NULL, 1u << 20, NULL, NULL), -EINVAL);
		nvio_handle_destroy(h);
	}
	T_FOR_EACH_COMBO(e, d) {
		one(e, d);
	}
	free(buf);
	free(back);
	return t_done();
}

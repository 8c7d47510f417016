/*
 * test_spare_readers.c - spare saves (NVIO_FILE_SPARE) never write a file
 * someone is reading, and give back what a failed one grew.
 *
 * A reader that opened the target keeps reading the version it opened
 * after two spare saves made that file the spare again: the second save
 * takes a fresh temporary instead (the reader's shared lock), and once
 * the reader closes, the next save reuses the spare; a target someone
 * else holds an exclusive lock on is still read. A reader whose file is
 * swapped out, rewritten and swapped back before it takes its lock reads
 * the version it holds, whole. Threads spare-saving
 * one path while others read it whole (nvio_read_file) always read one
 * complete version. A spare whose fallocate fails with ENOSPC after the
 * file system took part of it goes back to the size it had, and the error
 * names the real offset and size; an abandoned spare that writes grew
 * goes back to its size. Every engine, direct I/O on and off.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N (256u << 10)
#define VERSIONS 8

static unsigned char *buf, *back;
static char target[T_PATH_MAX], spare[T_PATH_MAX];

static ino_t ino_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? st.st_ino : 0;
}

static int64_t size_of(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* A spare save of n bytes of stream seed from mem. */
static int save(nvio_handle_t *h, unsigned char *mem, size_t n, uint64_t seed)
{
	nvio_file_t *f;
	int err = 0, r;

	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE |
			   NVIO_FILE_NOSYNC, &err);
	if (!f)
		return err;
	t_fill_random(mem, n, seed);
	r = nvio_file_pwrite(f, mem, n, 0, 0);
	if (!r)
		r = nvio_file_commit(f);
	if (nvio_file_close(f) < 0 && !r)
		r = -EIO;
	return r;
}

/* The reader's file still holds n bytes of stream seed. */
static void check_reader(nvio_file_t *r, size_t n, uint64_t seed)
{
	memset(back, 0, n);
	if (T_OK(nvio_file_pread(r, back, n, 0, 0)))
		T_EQ_INT(t_check_random_at(back, n, seed, 0), -1);
}

static void held(nvio_handle_t *h)
{
	nvio_file_t *r;
	ino_t x;
	int err = 0;

	t_ctx("%s reader holds the old target", t_combo());
	unlink(target);
	unlink(spare);
	T_OK(save(h, buf, N, 1));
	T_OK(save(h, buf, N, 2));		/* a spare now */
	r = nvio_file_open(h, target, NVIO_FILE_READ, &err);
	if (!T_TRUE(r != NULL))
		return;
	x = ino_of(target);
	T_OK(save(h, buf, N, 3));		/* the reader's file is the spare */
	T_EQ_U64(ino_of(spare), x);
	T_OK(save(h, buf, N, 4));		/* must not take it */
	T_EQ_U64(ino_of(spare), x);
	T_TRUE(ino_of(target) != x);
	check_reader(r, N, 2);
	T_OK(nvio_file_close(r));
	T_OK(save(h, buf, N, 5));		/* free again: used */
	T_EQ_U64(ino_of(target), x);
	T_OK(t_check_file_random(target, 0, N, 5, 0));

	t_ctx("%s target locked by someone else", t_combo());
	{
		int fd = open(target, O_RDONLY);

		T_TRUE(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
		r = nvio_file_open(h, target, NVIO_FILE_READ, &err);	/* read as before */
		if (T_TRUE(r != NULL)) {
			check_reader(r, N, 5);
			T_OK(nvio_file_close(r));
		}
		close(fd);
	}
}

/*
 * The reader opens the target (v2) and looks at its size; before it
 * takes its lock, two spare saves make that file the spare, rewrite it
 * with a longer version and swap it back: the same inode at the name
 * again. The reader must see the version it then holds, whole (its size
 * and bytes), not the old size over the new bytes.
 */
static nvio_handle_t *aba_h;
static atomic_int aba_armed;

static int h_flock_aba(int fd, int op)
{
	if (op == (LOCK_SH | LOCK_NB) && atomic_exchange(&aba_armed, 0)) {
		T_OK(save(aba_h, buf, N / 2, 3));	/* the reader's file: the spare */
		T_OK(save(aba_h, buf, N, 4));		/* rewritten, the target again */
	}
	return flock(fd, op);
}

static void aba(nvio_handle_t *h)
{
	nvio_file_info_t info = { .struct_size = sizeof(info) };
	nvio_file_t *r;
	ino_t x;
	int err = 0;

	t_ctx("%s the reader's file swapped out and back before its lock", t_combo());
	unlink(target);
	unlink(spare);
	T_OK(save(h, buf, N / 4, 1));
	T_OK(save(h, buf, N / 4, 2));		/* a spare now */
	x = ino_of(target);
	aba_h = h;
	atomic_store(&aba_armed, 1);
	nvio__sys.flock = h_flock_aba;
	r = nvio_file_open(h, target, NVIO_FILE_READ, &err);
	nvio__sys_reset();
	T_EQ_INT(atomic_load(&aba_armed), 0);
	T_EQ_U64(ino_of(target), x);		/* the same file, version 4 */
	if (!T_TRUE(r != NULL))
		return;
	T_OK(nvio_file_info(r, &info));
	T_EQ_U64(info.size, N);
	check_reader(r, N, 4);
	T_OK(nvio_file_close(r));
}

struct stress {
	nvio_handle_t *h;
	int writer;
	int rounds;
	int torn;
	int errors;
};

/* Every version is n bytes of stream (seed) with n = N - seed * 4096. */
static void *stress_thread(void *arg)
{
	struct stress *s = arg;
	unsigned char *mem = t_alloc(N);
	uint64_t st = (uint64_t)(uintptr_t)s;

	for (int i = 0; i < s->rounds; i++) {
		uint64_t seed = t_rand64(&st) % VERSIONS + 1, got = 0;

		if (s->writer) {
			if (save(s->h, mem, N - seed * 4096, seed))
				s->errors++;
			continue;
		}
		if (nvio_read_file(s->h, mem, N, target, &got, 0)) {
			s->errors++;
			continue;
		}
		seed = (N - got) / 4096;
		if (got % 4096 || seed < 1 || seed > VERSIONS ||
		    t_check_random_at(mem, got, seed, 0) != -1)
			s->torn++;
	}
	free(mem);
	return NULL;
}

static void stress(nvio_handle_t *h)
{
	struct stress s[4];
	pthread_t t[4];
	int rounds = T_SANITIZED ? 40 : 150;

	t_ctx("%s spare saves and readers", t_combo());
	T_OK(save(h, buf, N - 4096, 1));
	for (int i = 0; i < 4; i++) {
		s[i] = (struct stress){ h, i < 2, rounds, 0, 0 };
		T_OK(pthread_create(&t[i], NULL, stress_thread, &s[i]));
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		T_EQ_INT(s[i].torn, 0);
		T_EQ_INT(s[i].errors, 0);
	}
}

/* fallocate that takes half of what is asked, then finds the disk full. */
static int h_fallocate_half(int fd, int mode, off_t off, off_t len)
{
	struct stat st;

	if (mode == 0 && fstat(fd, &st) == 0 && off + len / 2 > st.st_size)
		(void)ftruncate(fd, off + len / 2);
	errno = ENOSPC;
	return -1;
}

static void rollback(nvio_handle_t *h)
{
	nvio_error_t e;
	nvio_file_t *f;
	int64_t old;
	int err = 0;

	t_ctx("%s ENOSPC in a spare's fallocate", t_combo());
	T_OK(save(h, buf, N, 6));
	T_OK(save(h, buf, N, 7));
	old = size_of(spare);
	T_EQ_INT(old, N);
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (!T_TRUE(f != NULL))
		return;
	nvio__sys.fallocate = h_fallocate_half;
	T_ERR(nvio_file_allocate(f, 0, 12u << 20), -ENOSPC);
	nvio__sys_reset();
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -ENOSPC);
	T_EQ_U64(e.nbytes, 12u << 20);
	T_EQ_INT(e.offset, 0);
	T_EQ_INT(size_of(spare), old);		/* back, blocks kept */
	T_OK(nvio_file_close(f));
	T_OK(t_check_file_random(target, 0, N, 7, 0));

	t_ctx("%s abandoned spare grown by writes", t_combo());
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (!T_TRUE(f != NULL))
		return;
	t_fill_random(buf, N, 8);
	T_OK(nvio_file_pwrite(f, buf, N, 3 * N, 0));
	T_EQ_INT(size_of(spare), 4 * N);
	T_OK(nvio_file_close(f));		/* not committed */
	T_EQ_INT(size_of(spare), old);
	T_OK(t_check_file_random(target, 0, N, 7, 0));
}

static atomic_int statx_calls;

static int h_statx_path_fails(int dfd, const char *p, int fl, unsigned mask, struct statx *sx)
{
	if (p[0]) {	/* a name, not the descriptor's own statx */
		atomic_fetch_add(&statx_calls, 1);
		errno = EACCES;
		return -1;
	}
	return statx(dfd, p, fl, mask, sx);
}

/*
 * The reader's look at the name (is it still the file opened?) goes
 * through the nvio__sys table: failed there, the open fails at once with
 * that errno and the step named, its descriptor closed (it was a plain
 * stat no test could fail).
 */
static void name_check_fails(nvio_handle_t *h)
{
	nvio_error_t le = { .struct_size = sizeof(le) };
	nvio_file_t *r;
	int err = 0, fds;

	t_ctx("%s the reader's name check failed", t_combo());
	t_fill_random(buf, 4096, 9);
	T_OK(t_write_file(target, buf, 4096));
	fds = t_count_fds();
	atomic_store(&statx_calls, 0);
	nvio__sys.statx = h_statx_path_fails;
	r = nvio_file_open(h, target, NVIO_FILE_READ, &err);
	nvio__sys_reset();
	T_EQ_INT(r == NULL, 1);
	T_EQ_INT(err, -EACCES);
	T_EQ_INT(atomic_load(&statx_calls), 1);
	T_EQ_INT(nvio_last_error(h, &le), -EACCES);
	T_EQ_INT(strncmp(le.what, "stat", 4), 0);
	T_EQ_INT(strcmp(le.path, target), 0);
	if (r)
		nvio_file_close(r);
	T_EQ_INT(t_count_fds(), fds);
}

int main(void)
{
	t_init("spare_readers");
	buf = t_alloc(N);
	back = t_alloc(N);
	t_path(target, "target");
	t_path(spare, ".target.nvio-spare");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 0))
			continue;
		held(h);
		aba(h);
		stress(h);
		rollback(h);
		name_check_fails(h);
		unlink(target);
		unlink(spare);
		nvio_handle_destroy(h);
	}
	free(buf);
	free(back);
	return t_done();
}

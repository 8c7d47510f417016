/*
 * test_shared_attack.c - multi-writer atomic files (NVIO_FILE_SHARED,
 * nvio_file_join) attacked as a careless caller and a hostile neighbour
 * would (review of libnvio 0.3's shared files).
 *
 * 1. spare_abandon: a creator with NVIO_FILE_SPARE abandons while a
 *    writer still writes (the documented reason to abandon: another
 *    writer failed). nvio_file_join(3) promises that writers still
 *    writing then write to a nameless file; with a spare the abandoned
 *    temporary used to stay (same inode) and become the next save's
 *    temporary, so the late writer's bytes landed in the NEXT save's
 *    committed file, and a late join with the old identity still passed.
 * 2. fifo_swap: after a writer joined, its temporary's name is replaced
 *    by a FIFO (a neighbour with write access to the directory, or a
 *    careless same-user cleanup). The writer's first O_DIRECT write
 *    reopens the temporary by name: that open must not block on the FIFO
 *    (it used to hang forever, no reader); the write goes to the file
 *    the writer joined. A watchdog turns a hang into a failure.
 *
 * Writers here are second handles of this process: join compares only
 * names and identities, so the processes need not differ (test_shared_file
 * runs forked writers). Every engine, direct on and off.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N (1u << 20)
#define LATE 4096u	/* what the late writer writes at 0 */

static unsigned char *old, *nu, *junk, *back;

static void check_file(const char *path, const unsigned char *want, size_t n)
{
	memset(back, 0, n);
	T_EQ_INT(t_file_size(path), (int64_t)n);
	T_OK(t_pread_file(path, back, n, 0));
	T_MEM_EQ(back, want, n);
}

/*
 * The spare's removal happens while its lock is held: else another save
 * of the target could take the spare (lock, name check) between the
 * unlock and the unlink and lose its temporary's name. The sys table's
 * unlink tries the lock on a spare it is asked to remove.
 */
static int unlocked_unlinks;

static int checking_unlink(const char *path)
{
	size_t n = strlen(path), k = strlen(".nvio-spare");
	int fd;

	if (n > k && !strcmp(path + n - k, ".nvio-spare") &&
	    (fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			unlocked_unlinks++;
		close(fd);
	}
	return unlink(path);
}

static void spare_abandon(int e, int d, int i)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX];
	nvio_handle_t *h, *hw;
	nvio_file_t *c, *w, *late;
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	unsigned fl = NVIO_FILE_ATOMIC | NVIO_FILE_SHARED | NVIO_FILE_SPARE;
	int err;

	if (t_handle(&h, e, d, 0, 0))
		return;
	if (t_handle(&hw, e, d, 0, 0)) {
		nvio_handle_destroy(h);
		return;
	}
	t_path(target, "spare%d", i);
	T_OK(t_write_file(target, old, N));

	/* save 1: a writer joins, the creator abandons (say another failed) */
	c = nvio_file_open(h, target, fl, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	T_TRUE(nvio_file_temp_path(c) != NULL);
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(nvio_file_share(c, &sh));
	w = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w != NULL);
	unlocked_unlinks = 0;
	nvio__sys.unlink = checking_unlink;
	T_OK(nvio_file_close(c));
	nvio__sys.unlink = unlink;
	T_EQ_INT(unlocked_unlinks, 0);

	/* save 2 of the same target, written whole by its creator */
	c = nvio_file_open(h, target, fl, &err);
	T_TRUE(c != NULL);
	if (!c) {
		nvio_file_close(w);
		goto out;
	}
	T_OK(nvio_file_pwrite(c, nu, N, 0, 0));
	/* the abandoned save's writer goes on writing its share... */
	if (w)
		T_OK(nvio_file_pwrite(w, junk, LATE, 0, 0));
	/* ...and a writer of it that joins late is refused */
	late = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(late == NULL);
	if (late) {
		T_FAILF("a late join of the abandoned save's temporary %s succeeded", tmp);
		nvio_file_close(late);
	} else {
		T_TRUE(err == -ENOENT || err == -ESTALE);
	}
	T_OK(nvio_file_commit(c));
	T_OK(nvio_file_close(c));
	if (w)
		T_OK(nvio_file_close(w));
	/* save 2 is its creator's bytes, none of the abandoned writer's */
	check_file(target, nu, N);
out:
	nvio_handle_destroy(hw);
	nvio_handle_destroy(h);
}

/*
 * 1b. spare_kept: the writers closed before the creator abandons: nobody
 *     else holds the spare open, so it is kept (same inode, its blocks
 *     for the next save, as any spare's) and the next save through it
 *     commits its own bytes whole. Leases unavailable (the sys table's
 *     fcntl refuses F_SETLEASE with EINVAL), whether another open remains
 *     is unknown: the spare is removed.
 */
static int no_lease(int fd, int cmd, int arg)
{
	if (cmd == F_SETLEASE) {
		errno = EINVAL;
		return -1;
	}
	return fcntl(fd, cmd, arg);
}

/*
 * A lease held by the probe is broken by another process's open of the
 * spare (a save of the target taking it) with a signal to this process:
 * SIGIO by default, which terminates. The probe's descriptor must name
 * a signal ignored by default when the lease is taken.
 */
static int lease_sig = -1;

static int recording_fcntl(int fd, int cmd, int arg)
{
	if (cmd == F_SETLEASE && arg == F_WRLCK)
		lease_sig = fcntl(fd, F_GETSIG);
	return fcntl(fd, cmd, arg);
}

static void spare_kept(int e, int d, int i, int nolease)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX];
	nvio_handle_t *h, *hw;
	nvio_file_t *c, *w;
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	unsigned fl = NVIO_FILE_ATOMIC | NVIO_FILE_SHARED | NVIO_FILE_SPARE;
	int (*sys_fcntl)(int, int, int) = nvio__sys.fcntl;
	struct stat st, st2;
	int err, kept;

	if (t_handle(&h, e, d, 0, 0))
		return;
	if (t_handle(&hw, e, d, 0, 0)) {
		nvio_handle_destroy(h);
		return;
	}
	t_path(target, "kept%d_%d", i, nolease);
	T_OK(t_write_file(target, old, N));

	/* save 1: a writer joins, writes its share and closes; then the
	 * creator abandons */
	c = nvio_file_open(h, target, fl, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	T_TRUE(nvio_file_temp_path(c) != NULL);
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(stat(tmp, &st));
	T_OK(nvio_file_share(c, &sh));
	w = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w != NULL);
	if (w) {
		T_OK(nvio_file_pwrite(w, junk, LATE, 0, 0));
		T_OK(nvio_file_close(w));
	}
	unlocked_unlinks = 0;
	nvio__sys.unlink = checking_unlink;
	lease_sig = -1;
	nvio__sys.fcntl = nolease ? no_lease : recording_fcntl;
	T_OK(nvio_file_close(c));
	nvio__sys.fcntl = sys_fcntl;
	if (!nolease)
		T_EQ_INT(lease_sig, SIGURG);
	nvio__sys.unlink = unlink;
	T_EQ_INT(unlocked_unlinks, 0);
	check_file(target, old, N);	/* the abandoned save changed nothing */
	kept = stat(tmp, &st2) == 0;
	if (nolease) {
		T_TRUE(!kept);
	} else {
		T_TRUE(kept);
		if (kept)
			T_TRUE(st2.st_dev == st.st_dev && st2.st_ino == st.st_ino);
	}

	/* save 2 of the same target, through the kept spare */
	c = nvio_file_open(h, target, fl, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	if (!nolease) {
		T_TRUE(nvio_file_temp_path(c) && !strcmp(nvio_file_temp_path(c), tmp));
		T_OK(stat(tmp, &st2));
		T_TRUE(st2.st_dev == st.st_dev && st2.st_ino == st.st_ino);
	}
	T_OK(nvio_file_pwrite(c, nu, N, 0, 0));
	T_OK(nvio_file_commit(c));
	T_OK(nvio_file_close(c));
	check_file(target, nu, N);
	if (!nolease) {
		/* its inode is the target's now */
		T_OK(stat(target, &st2));
		T_TRUE(st2.st_dev == st.st_dev && st2.st_ino == st.st_ino);
	}
out:
	nvio_handle_destroy(hw);
	nvio_handle_destroy(h);
}

/*
 * 3. stream_on_join: a writer writes its share with a plain (0.2) writer
 *    stream, not a writer of ranges. Its close set the file's size to
 *    where the stream ended, cutting off the shares other writers had
 *    already written after it: the committed file lost them. A joined
 *    file's size is its creator's, whatever stream writes it.
 */
static void stream_on_join(int e, int d, int i)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX];
	nvio_handle_t *h, *hw;
	nvio_file_t *c, *w0, *w1;
	nvio_stream_t *s;
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	int err;

	if (t_handle(&h, e, d, 0, 0))
		return;
	if (t_handle(&hw, e, d, 0, 0)) {
		nvio_handle_destroy(h);
		return;
	}
	t_path(target, "stream%d", i);
	T_OK(t_write_file(target, old, N));
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	T_OK(nvio_file_truncate(c, N));
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(nvio_file_share(c, &sh));
	/* writer 1 writes the second half and is done first */
	w1 = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w1 != NULL);
	if (w1) {
		T_OK(nvio_file_pwrite(w1, nu + N / 2, N / 2, N / 2, 0));
		T_OK(nvio_file_close(w1));
	}
	/* writer 0 streams the first half */
	w0 = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w0 != NULL);
	if (w0) {
		s = nvio_stream_open(w0, NVIO_STREAM_WRITE, 0, 0, 0, &err);
		T_TRUE(s != NULL);
		if (s) {
			T_EQ_INT(nvio_stream_write(s, nu, N / 2), N / 2);
			T_OK(nvio_stream_close(s, 0));
		}
		T_OK(nvio_file_close(w0));
	}
	T_OK(nvio_file_commit(c));
	T_OK(nvio_file_close(c));
	check_file(target, nu, N);
out:
	nvio_handle_destroy(hw);
	nvio_handle_destroy(h);
}

/*
 * 5. replaced: the temporary's name is published, so a careless writer
 *    (one that writes its share to a file of its own and renames it to
 *    the name, the habit of a plain atomic write) or a neighbour with
 *    write access to the directory can put another file there. The
 *    creator's commit renamed the NAME over the target: the target became
 *    that file (never fsynced by nvio, without the other shares), and
 *    an abandon or failed commit removed that other file. Now commit is
 *    -ESTALE, the target keeps its old bytes, the other file stays.
 */
static void replaced(int e, int d, int i, int abandon)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX], other[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *c;
	int err;

	if (t_handle(&h, e, d, 0, 0))
		return;
	t_path(target, "replaced%d-%d", i, abandon);
	t_path(other, "other%d-%d", i, abandon);
	T_OK(t_write_file(target, old, N));
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (!c) {
		nvio_handle_destroy(h);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(nvio_file_pwrite(c, nu, N, 0, 0));
	T_OK(t_write_file(other, junk, N));
	T_OK(rename(other, tmp) < 0 ? -errno : 0);
	if (!abandon)
		T_ERR(nvio_file_commit(c), -ESTALE);
	T_OK(nvio_file_close(c));
	check_file(target, old, N);
	check_file(tmp, junk, N);	/* not ours: left where it is */
	unlink(tmp);
	nvio_handle_destroy(h);
}

/*
 * 6. durable: whose fsync makes a writer's share durable? The creator's:
 *    fsync(2) is per file (inode), and the commit's fsync is of the one
 *    file every writer wrote. Checked through the sys table: writers
 *    write (through the page cache too) and close without any fsync of
 *    that file, and the commit fsyncs exactly that file (dev, ino) after
 *    them, before the rename; the target then holds every share.
 */
static uint64_t synced_dev, synced_ino;
static int synced;

static int record_fsync(int fd)
{
	struct stat st;

	if (fstat(fd, &st) == 0 && (uint64_t)st.st_dev == synced_dev &&
	    (uint64_t)st.st_ino == synced_ino)
		synced++;
	return fsync(fd);
}

static void durable(int e, int d, int i)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX];
	nvio_handle_t *h, *hw;
	nvio_file_t *c, *w;
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	int (*real_fsync)(int) = nvio__sys.fsync;
	int err;

	if (t_handle(&h, e, d, 0, 0))
		return;
	if (t_handle(&hw, e, d, 0, 0)) {
		nvio_handle_destroy(h);
		return;
	}
	t_path(target, "durable%d", i);
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(nvio_file_share(c, &sh));
	synced_dev = sh.dev;
	synced_ino = sh.ino;
	synced = 0;
	nvio__sys.fsync = record_fsync;
	T_OK(nvio_file_truncate(c, N));
	for (int k = 0; k < 2; k++) {	/* two writers, halves cut off a page */
		uint64_t off = k ? N / 2 + 100 : 0, len = k ? N - off : N / 2 + 100;

		w = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
		T_TRUE(w != NULL);
		if (w) {
			T_OK(nvio_file_pwrite(w, nu + off, len, (int64_t)off, 0));
			T_OK(nvio_file_close(w));
		}
	}
	T_EQ_INT(synced, 0);	/* the writers synced nothing */
	T_OK(nvio_file_commit(c));
	T_TRUE(synced >= 1);	/* the creator's commit synced their file */
	nvio__sys.fsync = real_fsync;
	T_OK(nvio_file_close(c));
	check_file(target, nu, N);
out:
	nvio__sys.fsync = real_fsync;
	nvio_handle_destroy(hw);
	nvio_handle_destroy(h);
}

/*
 * 7. stale: a creator that dies (crash, kill) leaves its named temporary:
 *    the sweep (nvio_clean_temporaries, as `nvio clean` and the next save
 *    of the target run it) finds it by the creator's stamp in the name
 *    and removes it; a live creator's temporary (writers still need it)
 *    is kept. Runs first, before this process has threads (fork).
 */
static void stale(void)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX] = "";
	int fds[2], st, n;
	pid_t pid;

	t_path(target, "stale");
	if (pipe(fds) < 0) {
		T_FAILF("pipe");
		return;
	}
	pid = fork();
	if (pid == 0) {
		nvio_handle_t *h;
		nvio_file_t *c;
		const char *t;
		int err;

		close(fds[0]);
		if (nvio_handle_create(&h, NULL))
			_exit(2);
		c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
		t = c ? nvio_file_temp_path(c) : NULL;
		if (!t || write(fds[1], t, strlen(t)) != (ssize_t)strlen(t))
			_exit(3);
		_exit(0);	/* dies with its file open: no close, no abandon */
	}
	close(fds[1]);
	n = pid < 0 ? -1 : (int)read(fds[0], tmp, sizeof(tmp) - 1);
	close(fds[0]);
	T_TRUE(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	       WEXITSTATUS(st) == 0);
	T_TRUE(n > 0);
	if (n <= 0)
		return;
	tmp[n] = 0;
	T_TRUE(access(tmp, F_OK) == 0);	/* left behind */
	T_TRUE(nvio_clean_temporaries(t_tmpdir(), NULL, 0, NULL, NULL) >= 1);
	T_TRUE(access(tmp, F_OK) < 0 && errno == ENOENT);
	T_TRUE(access(target, F_OK) < 0);	/* and nothing was published */
}

/* A live creator's temporary survives the sweep. */
static void live_kept(void)
{
	char target[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *c;
	int err;

	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 0, 0))
		return;
	t_path(target, "live");
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (c) {
		T_OK(nvio_clean_temporaries(t_tmpdir(), NULL, 0, NULL, NULL));
		T_TRUE(access(nvio_file_temp_path(c), F_OK) == 0);
		T_OK(nvio_file_close(c));
	}
	nvio_handle_destroy(h);
}

/*
 * 4. abi: nvio_file_share into a struct too small for the identity
 *    (struct_size covering dev only, or nothing) used to return 0 with
 *    the identity cut or missing; join's check of the same size (and of
 *    reserved fields that are not 0) holds.
 */
static void abi(void)
{
	char target[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *c, *w;
	nvio_share_t sh = { .struct_size = sizeof(sh) }, cut;
	int err;

	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 0, 0))
		return;
	t_path(target, "abi");
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (!c) {
		nvio_handle_destroy(h);
		return;
	}
	memset(&cut, 0xa5, sizeof(cut));
	cut.struct_size = offsetof(nvio_share_t, ino);
	T_ERR(nvio_file_share(c, &cut), -EINVAL);
	cut.struct_size = 8;
	T_ERR(nvio_file_share(c, &cut), -EINVAL);
	cut.struct_size = offsetof(nvio_share_t, reserved);	/* an older caller's */
	T_OK(nvio_file_share(c, &cut));
	T_OK(nvio_file_share(c, &sh));
	T_EQ_U64(cut.dev, sh.dev);
	T_EQ_U64(cut.ino, sh.ino);
	w = nvio_file_join(h, nvio_file_temp_path(c), &cut, NVIO_FILE_WRITE, &err);
	T_TRUE(w != NULL);	/* an older caller's share joins */
	if (w)
		T_OK(nvio_file_close(w));
	sh.reserved[4] = 1;
	w = nvio_file_join(h, nvio_file_temp_path(c), &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w == NULL);
	T_EQ_INT(err, -EINVAL);
	T_OK(nvio_file_close(c));
	nvio_handle_destroy(h);
}

static void on_alarm(int sig)
{
	static const char m[] = "FAIL: test_shared_attack hung (a FIFO at the "
				"temporary's name blocked an open)\n";

	(void)sig;
	(void)!write(2, m, sizeof(m) - 1);
	_exit(T_FAIL);
}

static void fifo_swap(int e, int d, int i)
{
	char target[T_PATH_MAX], tmp[T_PATH_MAX], moved[T_PATH_MAX];
	nvio_handle_t *h, *hw;
	nvio_file_t *c, *w;
	nvio_share_t sh = { .struct_size = sizeof(sh) };
	int err;

	if (t_handle(&h, e, d, 0, 0))
		return;
	if (t_handle(&hw, e, d, 0, 0)) {
		nvio_handle_destroy(h);
		return;
	}
	t_path(target, "fifo%d", i);
	t_path(moved, "moved%d", i);
	T_OK(t_write_file(target, old, N));
	c = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SHARED, &err);
	T_TRUE(c != NULL);
	if (!c)
		goto out;
	snprintf(tmp, sizeof(tmp), "%s", nvio_file_temp_path(c));
	T_OK(nvio_file_share(c, &sh));
	w = nvio_file_join(hw, tmp, &sh, NVIO_FILE_WRITE, &err);
	T_TRUE(w != NULL);
	/* the name now leads to a FIFO nobody reads; the file lives on */
	T_OK(rename(tmp, moved) < 0 ? -errno : 0);
	T_OK(mkfifo(tmp, 0600) < 0 ? -errno : 0);
	if (w) {
		alarm(60);	/* a watchdog, not a timing: a hang fails */
		T_OK(nvio_file_pwrite(w, nu, N, 0, 0));
		alarm(0);
		T_OK(nvio_file_close(w));
	}
	/* the bytes are in the file the writer joined */
	check_file(moved, nu, N);
	T_OK(nvio_file_close(c));
	unlink(moved);
	unlink(tmp);
	/* abandoned: the old file stands */
	check_file(target, old, N);
out:
	nvio_handle_destroy(hw);
	nvio_handle_destroy(h);
}

int main(void)
{
	t_init("shared_attack");
	stale();
	live_kept();
	signal(SIGALRM, on_alarm);
	old = t_alloc(N);
	nu = t_alloc(N);
	junk = t_alloc(N);
	back = t_alloc(N);
	t_fill_random(old, N, 1);
	t_fill_random(nu, N, 2);
	t_fill_random(junk, N, 3);
	T_FOR_EACH_COMBO(e, d) {
		spare_abandon(e, d, t_combo_i);
		spare_kept(e, d, t_combo_i, 0);
		spare_kept(e, d, t_combo_i, 1);
		fifo_swap(e, d, t_combo_i);
		stream_on_join(e, d, t_combo_i);
		replaced(e, d, t_combo_i, 0);
		replaced(e, d, t_combo_i, 1);
		durable(e, d, t_combo_i);
	}
	abi();
	free(old);
	free(nu);
	free(junk);
	free(back);
	return t_done();
}

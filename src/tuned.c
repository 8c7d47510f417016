/*
 * tuned.c - the tuned defaults `nvio tune` saves per directory.
 *
 * The file is $NVIO_TUNED_FILE if set, else $XDG_CONFIG_HOME/nvio/tuned.conf,
 * else $HOME/.config/nvio/tuned.conf. It is plain text, one entry a line:
 *
 *   # nvio-tuned 1
 *   read /mnt/nvme0 block_size=1048576 queue_depth=32 intra_op_parallelism=4 single_submit=0 overlap_events=1 engine=io_uring
 *   write /mnt/nvme0 block_size=8388608 queue_depth=64 ...
 *
 * The first word is the direction (read or write), the second the
 * realpath of the directory with '%', space, tab, CR and LF written as
 * %XX, then key=value pairs. Lines starting with '#' and blank lines are
 * comments; unknown keys are ignored (later versions may add some); a
 * later line for the same directory and direction wins. Keys: block_size
 * (bytes), queue_depth, intra_op_parallelism, single_submit (0|1),
 * overlap_events (0|1), engine (auto|io_uring|libaio|psync).
 *
 * Saving rewrites the whole file into a temporary in the same directory,
 * fsyncs it and renames it over the old one, so a reader sees the old or
 * the new file, never half of one. Savers serialize on flock() of that
 * directory, so concurrent `nvio tune` runs do not lose each other's
 * entries.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "nvio.h"
#include "sys.h"

#define TUNED_HEADER "# nvio-tuned 1: written by `nvio tune`, see nvio(1).\n" \
	"# DIRECTION REALPATH key=value ...\n"
#define TUNED_MAX_FILE (16u << 20)	/* refuse to slurp anything larger */

/* The file's name into buf; 0, -ENOENT without HOME, -ENAMETOOLONG. */
static int tuned_path(char *buf, size_t len)
{
	const char *f = getenv("NVIO_TUNED_FILE");
	const char *x = getenv("XDG_CONFIG_HOME");
	const char *home = getenv("HOME");
	int n;

	if (f && *f)
		n = snprintf(buf, len, "%s", f);
	else if (x && *x)
		n = snprintf(buf, len, "%s/nvio/tuned.conf", x);
	else if (home && *home)
		n = snprintf(buf, len, "%s/.config/nvio/tuned.conf", home);
	else
		return -ENOENT;
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int tuned_disabled(void)
{
	const char *v = getenv("NVIO_NO_TUNED");

	return v && *v && strcmp(v, "0") != 0;
}

/*
 * Reads the whole file into a NUL-terminated malloc'd string. A missing
 * file gives 0 and *out = NULL.
 */
static int slurp(const char *path, char **out)
{
	struct stat st;
	char *s;
	int fd, r;

	*out = NULL;
	fd = nvio__open(path, O_RDONLY, 0);
	if (fd == -ENOENT)
		return 0;
	if (fd < 0)
		return fd;
	r = nvio__sys.fstat(fd, &st) ? -errno : 0;
	if (!r && (uint64_t)st.st_size > TUNED_MAX_FILE)
		r = -EFBIG;
	s = r ? NULL : malloc((size_t)st.st_size + 1);
	if (!r && !s)
		r = -ENOMEM;
	if (!r)
		r = nvio__pread_full(fd, s, (size_t)st.st_size, 0);
	nvio__sys.close(fd);
	if (r) {
		free(s);
		return r == -ENODATA ? -EIO : r;	/* shrank under us */
	}
	s[st.st_size] = '\0';
	*out = s;
	return 0;
}

/* The directory's realpath, %-encoded as it appears in the file. */
static int dir_key(const char *dir, char *out, size_t len)
{
	char real[PATH_MAX];
	size_t o = 0;

	if (!dir || !*dir)
		return -EINVAL;
	if (!realpath(dir, real))
		return -errno;
	for (const unsigned char *p = (const unsigned char *)real; *p; p++) {
		int n;

		if (*p == '%' || *p == ' ' || *p == '\t' || *p == '\n' ||
		    *p == '\r')
			n = snprintf(out + o, len - o, "%%%02X", *p);
		else
			n = snprintf(out + o, len - o, "%c", *p);
		if (n < 0 || (size_t)n >= len - o)
			return -ENAMETOOLONG;
		o += (size_t)n;
	}
	return 0;
}

static int parse_num(const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long n;

	if (*v < '0' || *v > '9')
		return -EINVAL;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (*end || errno || n < min || n > max)
		return -EINVAL;
	*out = n;
	return 0;
}

/* Applies one key=value to cfg; unknown keys are ignored. */
static int apply_pair(nvio_config_t *cfg, const char *key, const char *v)
{
	uint64_t n = 0;
	int r = 0;

	if (!strcmp(key, "block_size") &&
	    !(r = parse_num(v, 512, 1ull << 30, &n)))
		cfg->block_size = n;
	else if (!strcmp(key, "queue_depth") &&
		 !(r = parse_num(v, 1, NVIO_MAX_QUEUE_DEPTH, &n)))
		cfg->queue_depth = (uint32_t)n;
	else if (!strcmp(key, "intra_op_parallelism") &&
		 !(r = parse_num(v, 1, NVIO_MAX_PARALLELISM, &n)))
		cfg->intra_op_parallelism = (uint32_t)n;
	else if (!strcmp(key, "single_submit") && !(r = parse_num(v, 0, 1, &n)))
		cfg->single_submit = (uint32_t)n;
	else if (!strcmp(key, "overlap_events") && !(r = parse_num(v, 0, 1, &n)))
		cfg->overlap_events = (uint32_t)n;
	else if (!strcmp(key, "engine")) {
		r = nvio_engine_from_name(v);
		if (r >= 0) {
			cfg->engine = r;
			r = 0;
		}
	}
	return r;
}

/* Applies every pair of an entry's tail ("k=v k=v") to cfg. */
static int apply_pairs(nvio_config_t *cfg, char *rest)
{
	char *save = NULL;

	for (char *t = strtok_r(rest, " \t", &save); t;
	     t = strtok_r(NULL, " \t", &save)) {
		char *eq = strchr(t, '=');
		int r;

		if (!eq)
			return -EINVAL;
		*eq = '\0';
		r = apply_pair(cfg, t, eq + 1);
		if (r)
			return r;
	}
	return 0;
}

/*
 * Splits a line into direction, key and the rest. Returns 1 if the line
 * is an entry for (key, dirname), 0 otherwise. Modifies the line.
 */
static int line_matches(char *line, const char *key, const char *dirname,
			char **rest)
{
	char *sp1, *sp2;

	if (*line == '#' || *line == '\0')
		return 0;
	sp1 = strchr(line, ' ');
	if (!sp1)
		return 0;
	*sp1 = '\0';
	sp2 = strchr(sp1 + 1, ' ');
	if (sp2)
		*sp2 = '\0';
	*rest = sp2 ? sp2 + 1 : sp1 + strlen(sp1 + 1) + 1;
	return !strcmp(line, dirname) && !strcmp(sp1 + 1, key);
}

int nvio_config_load_tuned(nvio_config_t *cfg, const char *dir, int for_write)
{
	char path[PATH_MAX], key[3 * PATH_MAX];
	char *text, *save = NULL, *rest = NULL;
	nvio_config_t found;
	int r, have = 0;

	if (!cfg || !dir || (for_write != 0 && for_write != 1))
		return -EINVAL;
	if (tuned_disabled())
		return 0;
	if (dir_key(dir, key, sizeof(key)))
		return 0;	/* no such directory: no entry */
	r = tuned_path(path, sizeof(path));
	if (r == -ENOENT)
		return 0;
	if (r || (r = slurp(path, &text)))
		return r;
	for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l;
	     l = strtok_r(NULL, "\n", &save)) {
		if (!line_matches(l, key, for_write ? "write" : "read", &rest))
			continue;
		found = *cfg;
		r = apply_pairs(&found, rest);
		have = !r;
	}
	free(text);
	if (have)
		*cfg = found;
	return have ? 1 : r;
}

/* ---- saving ---- */

static int cfg_valid(const nvio_config_t *c)
{
	return c->block_size >= 512 && c->block_size <= (1ull << 30) &&
	       c->queue_depth >= 1 && c->queue_depth <= NVIO_MAX_QUEUE_DEPTH &&
	       c->intra_op_parallelism >= 1 &&
	       c->intra_op_parallelism <= NVIO_MAX_PARALLELISM &&
	       c->single_submit <= 1 && c->overlap_events <= 1 &&
	       nvio_engine_name(c->engine) != NULL;
}

/* mkdir -p of the directory part of path (0700 for new ones). */
static int make_parents(char *path)
{
	for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdir(path, 0700) && errno != EEXIST) {
			int e = errno;

			*p = '/';
			return -e;
		}
		*p = '/';
	}
	return 0;
}

/* The old file's lines, less comments and the entry being replaced. */
static size_t copy_others(const char *old, char *out, const char *key,
			  const char *dirname)
{
	size_t o = 0;

	while (old && *old) {
		const char *nl = strchr(old, '\n');
		size_t n = nl ? (size_t)(nl - old) : strlen(old);
		char line[3 * PATH_MAX + 512], *rest;

		if (n > 0 && n < sizeof(line) && *old != '#') {
			memcpy(line, old, n);
			line[n] = '\0';
			if (!line_matches(line, key, dirname, &rest)) {
				memcpy(out + o, old, n);
				out[o + n] = '\n';
				o += n + 1;
			}
		}
		old += n + (nl ? 1 : 0);
	}
	return o;
}

static int format_entry(char *out, size_t len, const nvio_config_t *c,
			const char *key, int for_write)
{
	return snprintf(out, len, "%s %s block_size=%llu queue_depth=%u "
			"intra_op_parallelism=%u single_submit=%u "
			"overlap_events=%u engine=%s\n",
			for_write ? "write" : "read", key,
			(unsigned long long)c->block_size, c->queue_depth,
			c->intra_op_parallelism, c->single_submit,
			c->overlap_events, nvio_engine_name(c->engine));
}

/* Writes text to path through path.tmp.PID: fsync, rename, fsync dir. */
static int replace_file(const char *path, const char *text, size_t n,
			int dirfd)
{
	char tmp[PATH_MAX + 32];
	int fd, r;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	nvio__sys.unlink(tmp);	/* a leftover of a crashed save */
	fd = nvio__open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0)
		return fd;
	r = nvio__pwrite_full(fd, text, n, 0);
	if (!r && nvio__sys.fsync(fd))
		r = -errno;
	if (nvio__sys.close(fd) && !r)
		r = -errno;
	if (!r && nvio__sys.rename(tmp, path))
		r = -errno;
	if (r) {
		nvio__sys.unlink(tmp);
		return r;
	}
	if (dirfd >= 0 && nvio__sys.fsync(dirfd))
		return -errno;
	return 0;
}

static int open_locked_dir(char *path)
{
	char *slash = strrchr(path, '/');
	int fd;

	if (slash == path)
		fd = nvio__open("/", O_RDONLY | O_DIRECTORY, 0);
	else if (slash) {
		*slash = '\0';
		fd = nvio__open(path, O_RDONLY | O_DIRECTORY, 0);
		*slash = '/';
	} else {
		fd = nvio__open(".", O_RDONLY | O_DIRECTORY, 0);
	}
	if (fd >= 0)
		while (flock(fd, LOCK_EX) && errno == EINTR)
			;
	return fd;
}

static int save_locked(const char *path, const char *key,
		       const nvio_config_t *cfg, int for_write, int dirfd)
{
	const char *dirname = for_write ? "write" : "read";
	char *old, *text;
	size_t n, cap;
	int r = slurp(path, &old);

	if (r)
		return r;
	cap = (old ? strlen(old) : 0) + sizeof(TUNED_HEADER) + 3 * PATH_MAX +
	      512;
	text = malloc(cap);
	if (!text) {
		free(old);
		return -ENOMEM;
	}
	n = (size_t)snprintf(text, cap, "%s", TUNED_HEADER);
	n += copy_others(old, text + n, key, dirname);
	n += (size_t)format_entry(text + n, cap - n, cfg, key, for_write);
	r = replace_file(path, text, n, dirfd);
	free(text);
	free(old);
	return r;
}

int nvio_config_save_tuned(const nvio_config_t *cfg, const char *dir,
			   int for_write)
{
	char path[PATH_MAX], key[3 * PATH_MAX];
	int r, dirfd;

	if (!cfg || !dir || (for_write != 0 && for_write != 1) ||
	    !cfg_valid(cfg))
		return -EINVAL;
	if ((r = dir_key(dir, key, sizeof(key))) ||
	    (r = tuned_path(path, sizeof(path))) || (r = make_parents(path)))
		return r;
	dirfd = open_locked_dir(path);
	if (dirfd < 0)
		return dirfd;
	r = save_locked(path, key, cfg, for_write, dirfd);
	nvio__sys.close(dirfd);	/* releases the lock */
	return r;
}

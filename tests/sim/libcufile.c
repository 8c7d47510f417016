/*
 * tests/sim/libcufile.c - a simulated NVIDIA cuFile (libcufile.so.0) over
 * the simulated CUDA driver (libcuda.c), for the tests. nvio loads it
 * through NVIO_CUFILE_LIB or nvio_cufile_set_library().
 *
 * As the library does:
 *  - cuFileDriverOpen/Close are counted; every other call needs the
 *    driver open (CU_FILE_DRIVER_NOT_INITIALIZED) and the simulated CUDA
 *    driver loaded (CU_FILE_CUDA_DRIVER_ERROR).
 *  - cuFileHandleRegister takes an open descriptor (CU_FILE_HANDLE_TYPE_
 *    OPAQUE_FD); a handle registered twice is refused. In "direct" mode
 *    ($NVIO_SIM_CUFILE_MODE=direct or sim_cufile_set_mode) the descriptor
 *    must have O_DIRECT (CU_FILE_INVALID_FILE_OPEN_FLAG otherwise); in
 *    the default "compat" mode any descriptor goes, as cuFile's
 *    compatibility mode takes them.
 *  - cuFileBufRegister takes simulated device memory only
 *    (CU_FILE_CUDA_POINTER_INVALID, _RANGE_ERROR), once
 *    (CU_FILE_MEMORY_ALREADY_REGISTERED); deregistering what is not
 *    registered is CU_FILE_MEMORY_NOT_REGISTERED.
 *  - cuFileRead/Write move bytes between the file and device memory
 *    through a bounce buffer inside the library (pread/pwrite, then the
 *    simulator's private view of device memory): device memory is never
 *    touched through its faulting addresses. The buffer is addressed as
 *    base + offset; with a registered base the range must lie inside the
 *    registration. A read at the end of the file is short, as pread.
 *  - The descriptor registered must stay open, on the same file, until
 *    the handle is deregistered: otherwise a violation is counted (and
 *    the I/O fails with EBADF).
 *  - Any call fails by count (sim_cufile_fail, $NVIO_SIM_CUFILE_FAIL, as
 *    the CUDA simulator's): with the CU_FILE_* code, or for cuFileRead/
 *    Write with a code below 5000 as -1 and that errno.
 */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "sim.h"

#define API __attribute__((visibility("default")))

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
	int type;
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} CUfileDescr_t;

#define BASE 5000
enum {
	DRIVER_NOT_INITIALIZED = BASE + 1,
	CUDA_DRIVER_ERROR = BASE + 11,
	CUDA_POINTER_INVALID = BASE + 12,
	CUDA_POINTER_RANGE_ERROR = BASE + 14,
	INVALID_FILE_TYPE = BASE + 18,
	INVALID_FILE_OPEN_FLAG = BASE + 19,
	INVALID_VALUE = BASE + 22,
	MEMORY_ALREADY_REGISTERED = BASE + 23,
	MEMORY_NOT_REGISTERED = BASE + 24,
	HANDLE_NOT_REGISTERED = BASE + 27,
	HANDLE_ALREADY_REGISTERED = BASE + 28,
};

#define MAX_RULES 16
#define BOUNCE (1u << 20)

struct handle {
	int fd;			/* the caller's */
	int own;		/* ours on the same file, without O_DIRECT */
	dev_t dev;
	ino_t ino;
	struct handle *next;
};

struct buf { uintptr_t p; size_t n; struct buf *next; };
struct rule { char fn[48]; unsigned long after, times; int code; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int opens, direct_mode = -1;
static unsigned long ios, violations;
static long nhandles, nbufs;
static struct handle *handles;
static struct buf *bufs;
static struct rule rules[MAX_RULES];
static unsigned nrules;
static void *(*cu_shadow)(const void *, size_t, int *);
static int (*cu_range)(const void *, void **, size_t *);

static void add_rule(const char *fn, unsigned long after, unsigned long times, int code)
{
	struct rule *r = NULL;

	for (unsigned i = 0; i < nrules; i++)
		if (!strcmp(rules[i].fn, fn))
			r = &rules[i];
	if (!r && nrules == MAX_RULES)
		return;
	if (!r)
		r = &rules[nrules++];
	snprintf(r->fn, sizeof(r->fn), "%s", fn);
	r->after = after;
	r->times = times;
	r->code = code;
}

/* lock held */
static int fail_now(const char *fn)
{
	static int env_read;

	if (!env_read) {
		const char *e = getenv("NVIO_SIM_CUFILE_FAIL");
		char b[512], *save = NULL;

		env_read = 1;
		snprintf(b, sizeof(b), "%s", e ? e : "");
		for (char *t = strtok_r(b, ";,", &save); t; t = strtok_r(NULL, ";,", &save)) {
			char name[48];
			unsigned long after = 0, times = 1;
			int code = BASE + 30;

			if (sscanf(t, "%47[^:]:%lu:%lu:%d", name, &after, &times, &code) >= 1)
				add_rule(name, after, times, code);
		}
	}
	for (unsigned i = 0; i < nrules; i++) {
		struct rule *r = &rules[i];

		if (!r->times || (strcmp(r->fn, fn) && strcmp(r->fn, "*")))
			continue;
		if (r->after > 0) {
			r->after--;
			continue;
		}
		if (r->times != SIM_ALWAYS)
			r->times--;
		return r->code;
	}
	return 0;
}

static CUfileError_t result(int err)
{
	CUfileError_t e = { err, 0 };

	return e;
}

static int is_direct(void)
{
	if (direct_mode < 0) {
		const char *m = getenv("NVIO_SIM_CUFILE_MODE");

		direct_mode = m && !strcmp(m, "direct");
	}
	return direct_mode;
}

/* The driver open and the CUDA simulator at hand. lock held. */
static int ready(void)
{
	if (!opens)
		return DRIVER_NOT_INITIALIZED;
	return cu_shadow && cu_range ? 0 : CUDA_DRIVER_ERROR;
}

API CUfileError_t cuFileDriverOpen(void)
{
	int e;

	pthread_mutex_lock(&lock);
	e = fail_now("cuFileDriverOpen");
	if (!e && !cu_shadow) {
		void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

		cu_shadow = cu ? (void *(*)(const void *, size_t, int *))
			dlsym(cu, "sim_cuda_shadow") : NULL;
		cu_range = cu ? (int (*)(const void *, void **, size_t *))
			dlsym(cu, "sim_cuda_range") : NULL;
		if (!cu_shadow || !cu_range)
			e = CUDA_DRIVER_ERROR;	/* no (simulated) CUDA driver */
	}
	if (!e)
		opens++;
	pthread_mutex_unlock(&lock);
	return result(e);
}

API CUfileError_t cuFileDriverClose_v2(void)
{
	int e;

	pthread_mutex_lock(&lock);
	e = fail_now("cuFileDriverClose");
	if (!e && !opens)
		e = DRIVER_NOT_INITIALIZED;
	if (!e)
		opens--;
	pthread_mutex_unlock(&lock);
	return result(e);
}

API CUfileError_t cuFileDriverClose(void)
{
	return cuFileDriverClose_v2();
}

API CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
	struct handle *h;
	struct stat st;
	char path[64];
	int e, fl;

	pthread_mutex_lock(&lock);
	if ((e = fail_now("cuFileHandleRegister")) || (e = ready()))
		goto out;
	if (!fh || !d || d->type != 1) {
		e = INVALID_VALUE;
		goto out;
	}
	fl = fcntl(d->handle.fd, F_GETFL);
	if (fl < 0 || fstat(d->handle.fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		e = INVALID_FILE_TYPE;
		goto out;
	}
	if (is_direct() && !(fl & O_DIRECT)) {
		e = INVALID_FILE_OPEN_FLAG;
		goto out;
	}
	for (h = handles; h; h = h->next)
		if (h->fd == d->handle.fd) {
			e = HANDLE_ALREADY_REGISTERED;
			goto out;
		}
	h = calloc(1, sizeof(*h));
	if (!h) {
		e = BASE + 36;	/* CU_FILE_NO_MEMORY? internal */
		goto out;
	}
	/* Unaligned pieces through the bounce: a descriptor without O_DIRECT. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", d->handle.fd);
	h->own = open(path, (fl & O_ACCMODE) | O_CLOEXEC);
	if (h->own < 0) {
		free(h);
		e = INVALID_FILE_TYPE;
		goto out;
	}
	h->fd = d->handle.fd;
	h->dev = st.st_dev;
	h->ino = st.st_ino;
	h->next = handles;
	handles = h;
	nhandles++;
	*fh = h;
out:
	pthread_mutex_unlock(&lock);
	return result(e);
}

/* Whether the caller's descriptor still is the file registered. */
static int still_open(const struct handle *h)
{
	struct stat st;

	return fstat(h->fd, &st) == 0 && st.st_dev == h->dev && st.st_ino == h->ino;
}

API void cuFileHandleDeregister(void *fh)
{
	struct handle **ph;

	pthread_mutex_lock(&lock);
	for (ph = &handles; *ph && *ph != fh; ph = &(*ph)->next)
		;
	if (!fh || !*ph) {
		violations++;
		fprintf(stderr, "cufile-sim: violation: deregistering an unknown handle\n");
	} else {
		struct handle *h = *ph;

		if (!still_open(h)) {
			violations++;
			fprintf(stderr, "cufile-sim: violation: descriptor %d closed "
				"before its handle was deregistered\n", h->fd);
		}
		*ph = h->next;
		close(h->own);
		free(h);
		nhandles--;
	}
	pthread_mutex_unlock(&lock);
}

static struct buf *find_buf(uintptr_t p, int exact)
{
	for (struct buf *b = bufs; b; b = b->next)
		if (exact ? b->p == p : p >= b->p && p - b->p < b->n)
			return b;
	return NULL;
}

API CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags)
{
	struct buf *b;
	int e;

	pthread_mutex_lock(&lock);
	if ((e = fail_now("cuFileBufRegister")) || (e = ready()))
		goto out;
	if (!p || !n) {
		e = INVALID_VALUE;
		goto out;
	}
	if (!cu_shadow(p, 1, NULL)) {
		e = CUDA_POINTER_INVALID;
		goto out;
	}
	if (!cu_shadow(p, n, NULL)) {
		e = CUDA_POINTER_RANGE_ERROR;
		goto out;
	}
	for (b = bufs; b; b = b->next)
		if ((uintptr_t)p < b->p + b->n && (uintptr_t)p + n > b->p) {
			e = MEMORY_ALREADY_REGISTERED;
			goto out;
		}
	b = calloc(1, sizeof(*b));
	if (!b) {
		e = BASE + 36;
		goto out;
	}
	*b = (struct buf){ (uintptr_t)p, n, bufs };
	bufs = b;
	nbufs++;
out:
	pthread_mutex_unlock(&lock);
	return result(e);
}

API CUfileError_t cuFileBufDeregister(const void *p)
{
	struct buf **pb;
	int e;

	pthread_mutex_lock(&lock);
	if ((e = fail_now("cuFileBufDeregister")) || (e = ready()))
		goto out;
	for (pb = &bufs; *pb && (*pb)->p != (uintptr_t)p; pb = &(*pb)->next)
		;
	if (!*pb) {
		e = MEMORY_NOT_REGISTERED;
		goto out;
	}
	{
		struct buf *b = *pb;

		*pb = b->next;
		free(b);
		nbufs--;
	}
out:
	pthread_mutex_unlock(&lock);
	return result(e);
}

/*
 * Checks a transfer and returns the device bytes' private view, or NULL
 * with *e set (a CU_FILE_* code, or -errno).
 */
static char *prepare(const char *fn, void *fh, const void *base, size_t n,
		     off_t off, off_t boff, struct handle **out, int *e)
{
	struct handle *h;
	struct buf *b;
	uintptr_t p = (uintptr_t)base + (uintptr_t)boff;
	char *shadow;

	*e = fail_now(fn);
	if (*e)
		return NULL;
	if ((*e = ready()))
		return NULL;
	for (h = handles; h && h != fh; h = h->next)
		;
	if (!h) {
		*e = HANDLE_NOT_REGISTERED;
		return NULL;
	}
	if (!still_open(h)) {
		violations++;
		fprintf(stderr, "cufile-sim: violation: %s on handle of closed "
			"descriptor %d\n", fn, h->fd);
		*e = -EBADF;
		return NULL;
	}
	if (off < 0 || boff < 0) {
		*e = INVALID_VALUE;
		return NULL;
	}
	b = find_buf((uintptr_t)base, 1);
	if (b && (uint64_t)boff + n > b->n) {
		*e = CUDA_POINTER_RANGE_ERROR;
		return NULL;
	}
	shadow = cu_shadow((const void *)p, n ? n : 1, NULL);
	if (!shadow)
		*e = cu_shadow(base, 1, NULL) ? CUDA_POINTER_RANGE_ERROR :
		     CUDA_POINTER_INVALID;
	*out = h;
	ios++;
	return shadow;
}

static ssize_t fail_ret(int e)
{
	if (e < 0 || e < BASE) {
		errno = e < 0 ? -e : e;
		return -1;
	}
	return -(ssize_t)e;
}

static ssize_t move(int is_write, void *fh, const void *base, size_t n,
		    off_t off, off_t boff)
{
	struct handle *h = NULL;
	char *dev, *bounce;
	size_t done = 0;
	int e;

	pthread_mutex_lock(&lock);
	dev = prepare(is_write ? "cuFileWrite" : "cuFileRead", fh, base, n, off,
		      boff, &h, &e);
	pthread_mutex_unlock(&lock);
	if (!dev)
		return fail_ret(e);
	bounce = malloc(BOUNCE);
	if (!bounce) {
		errno = ENOMEM;
		return -1;
	}
	while (done < n) {
		size_t k = n - done < BOUNCE ? n - done : BOUNCE;
		ssize_t r;

		if (is_write) {
			memcpy(bounce, dev + done, k);
			r = pwrite(h->own, bounce, k, off + (off_t)done);
		} else {
			r = pread(h->own, bounce, k, off + (off_t)done);
			if (r > 0)
				memcpy(dev + done, bounce, (size_t)r);
		}
		if (r < 0) {
			if (errno == EINTR)
				continue;
			free(bounce);
			return done ? (ssize_t)done : -1;
		}
		if (r == 0)
			break;
		done += (size_t)r;
	}
	free(bounce);
	return (ssize_t)done;
}

API ssize_t cuFileRead(void *fh, void *base, size_t n, off_t off, off_t boff)
{
	return move(0, fh, base, n, off, boff);
}

API ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t off, off_t boff)
{
	return move(1, fh, base, n, off, boff);
}

/* ---- the tests' back door (sim.h) ---- */

API void sim_cufile_fail(const char *fn, unsigned long after, unsigned long times,
			 int code)
{
	pthread_mutex_lock(&lock);
	fail_now("");	/* reads the environment's rules first */
	add_rule(fn, after, times, code);
	pthread_mutex_unlock(&lock);
}

API void sim_cufile_set_mode(int direct)
{
	pthread_mutex_lock(&lock);
	direct_mode = direct;
	pthread_mutex_unlock(&lock);
}

#define COUNTER(type, name, expr)		\
	API type name(void)			\
	{					\
		type v;				\
		pthread_mutex_lock(&lock);	\
		v = (expr);			\
		pthread_mutex_unlock(&lock);	\
		return v;			\
	}

COUNTER(unsigned long, sim_cufile_ios, ios)
COUNTER(unsigned long, sim_cufile_violations, violations)
COUNTER(long, sim_cufile_handles, nhandles)
COUNTER(long, sim_cufile_bufs, nbufs)
COUNTER(int, sim_cufile_open_count, opens)

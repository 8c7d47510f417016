/*
 * locked.c - page-aligned, page-locked host memory.
 *
 * Every live allocation is recorded in a small sorted table so that
 * nvio_mem_free can refuse pointers it did not hand out (a double free
 * is an error, not a crash) and nvio_mem_query can tell whether a range
 * lies inside locked memory.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "sys.h"

struct region {
	uintptr_t base;
	size_t len;
	int locked;
};

static pthread_mutex_t regions_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;	/* sorted by base */
static size_t nregions, cap_regions;

#define HUGE_PAGE (2u << 20)

/*
 * Aligned memory for I/O. Buffers of 2 MiB or more are aligned to 2 MiB
 * and asked to be backed by transparent huge pages (before their first
 * touch): a device takes a bounded number of memory segments per request,
 * so scattered 4 KiB pages cut large requests into small ones
 * (bench/results/measured-constants.md).
 */
int nvio__mem_alloc_aligned(void **out, size_t n, size_t align)
{
	void *p = NULL;
	int r;

	if (n >= HUGE_PAGE && align < HUGE_PAGE)
		align = HUGE_PAGE;
	r = posix_memalign(&p, align, n ? n : 1);
	if (r)
		return -r;
	if (n >= HUGE_PAGE)
		madvise(p, n / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);	/* a hint */
	*out = p;
	return 0;
}

/* Index of the first region with base > key. Call with the lock held. */
static size_t upper_bound(uintptr_t key)
{
	size_t lo = 0, hi = nregions;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (regions[mid].base <= key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int remember(void *p, size_t len, int locked)
{
	size_t i;

	pthread_mutex_lock(&regions_lock);
	if (nregions == cap_regions) {
		size_t cap = cap_regions ? cap_regions * 2 : 16;
		struct region *nr = realloc(regions, cap * sizeof(*nr));

		if (!nr) {
			pthread_mutex_unlock(&regions_lock);
			return -ENOMEM;
		}
		regions = nr;
		cap_regions = cap;
	}
	i = upper_bound((uintptr_t)p);
	memmove(&regions[i + 1], &regions[i], (nregions - i) * sizeof(*regions));
	regions[i] = (struct region){ (uintptr_t)p, len, locked };
	nregions++;
	pthread_mutex_unlock(&regions_lock);
	return 0;
}

int nvio_mem_alloc(void **out, uint64_t nbytes, unsigned flags,
		   unsigned *flags_out)
{
	size_t len;
	void *p = NULL;
	int locked = 0, r;

	if (!out || (flags & ~NVIO_MEM_REQUIRE_LOCKED))
		return -EINVAL;
	if (nbytes > SIZE_MAX - NVIO__PAGE)
		return -ENOMEM;
	len = nbytes ? (size_t)nbytes : 1;
	r = nvio__mem_alloc_aligned(&p, len, NVIO__PAGE);
	if (r < 0)
		return r;
	memset(p, 0, len);	/* also faults the pages in before locking */
	if (nvio__sys.mlock(p, len) == 0) {
		locked = 1;
	} else if (flags & NVIO_MEM_REQUIRE_LOCKED) {
		r = -errno;
		free(p);
		return r;
	}
	r = remember(p, len, locked);
	if (r < 0) {
		if (locked)
			munlock(p, len);
		free(p);
		return r;
	}
	*out = p;
	if (flags_out)
		*flags_out = locked ? NVIO_MEM_LOCKED : 0;
	return 0;
}

int nvio_mem_free(void *p)
{
	struct region reg;
	size_t i;

	if (!p)
		return -EINVAL;
	pthread_mutex_lock(&regions_lock);
	i = upper_bound((uintptr_t)p);
	if (i == 0 || regions[i - 1].base != (uintptr_t)p) {
		pthread_mutex_unlock(&regions_lock);
		return -EINVAL;
	}
	reg = regions[i - 1];
	memmove(&regions[i - 1], &regions[i], (nregions - i) * sizeof(*regions));
	nregions--;
	pthread_mutex_unlock(&regions_lock);
	if (reg.locked)
		munlock(p, reg.len);
	free(p);
	return 0;
}

unsigned nvio_mem_query(const void *p, uint64_t nbytes)
{
	uintptr_t a = (uintptr_t)p;
	unsigned res = 0;
	size_t i;

	pthread_mutex_lock(&regions_lock);
	i = upper_bound(a);
	if (i > 0) {
		const struct region *r = &regions[i - 1];

		if (a - r->base <= r->len && nbytes <= r->len - (a - r->base))
			res = NVIO_MEM_NVIO | (r->locked ? NVIO_MEM_LOCKED : 0);
	}
	pthread_mutex_unlock(&regions_lock);
	return res;
}

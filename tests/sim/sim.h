/*
 * tests/sim/sim.h - the back door of the simulated CUDA driver
 * (libcuda.c) and cuFile (libcufile.c), for the tests.
 *
 * The simulators are loaded at run time in place of the real libraries
 * (libcuda.so.1 by its soname, libcufile.so.0 through NVIO_CUFILE_LIB or
 * nvio_cufile_set_library), so a test finds these functions with dlsym:
 * define SIM_LOADER before including this header to get sim_load(),
 * which fills a struct sim_api from the two libraries.
 *
 * Device pointers of the simulator fault on any host access; sim_cuda_peek,
 * _poke and _fill read and write them synchronously, beside the driver's
 * queues, as a test's own view of GPU memory.
 */
#ifndef NVIO_SIM_H
#define NVIO_SIM_H

#include <stddef.h>

/* times: fail every matching call from then on. */
#define SIM_ALWAYS (~0ul)

/*
 * Failure injection: after `after` more calls of fn succeed, the next
 * `times` calls fail with the driver's code (CUresult, or a cuFile
 * CU_FILE_* code; for cuFileRead/Write a code below 5000 is an errno,
 * returned as -1 with errno set, and a CU_FILE_* code is returned negated). fn "*" is any call; in the CUDA simulator "copy" fails a copy
 * when it executes (reported by its stream's next synchronisation).
 */
typedef void sim_fail_fn(const char *fn, unsigned long after,
			 unsigned long times, int code);

#ifdef SIM_LOADER
#include <dlfcn.h>
#include <stdio.h>

struct sim_api {
	void *(*alloc)(int dev, size_t n);	/* device memory, or NULL */
	int (*free)(void *p);
	int (*peek)(void *host, const void *dev, size_t n);	/* 0 or -1 */
	int (*poke)(void *dev, const void *host, size_t n);
	int (*fill)(void *dev, int byte, size_t n);
	unsigned long (*copies)(void);		/* copies executed */
	unsigned long (*pageable_copies)(void);	/* of unregistered host memory */
	unsigned long (*violations)(void);	/* misuse seen: must stay 0 */
	unsigned long (*queued)(void);		/* queued, not yet executed */
	unsigned long (*host_registered)(void);	/* ranges registered */
	long (*ctx_refs)(void);			/* primary context retains */
	sim_fail_fn *fail;
	void (*set_delay)(unsigned min_us, unsigned max_us);	/* per copy */
	void (*wait_idle)(void);
	/* cuFile */
	sim_fail_fn *cufile_fail;
	unsigned long (*cufile_ios)(void);	/* cuFileRead/Write calls */
	long (*cufile_handles)(void);		/* registered file handles */
	long (*cufile_bufs)(void);		/* registered buffers */
	int (*cufile_open_count)(void);		/* driver opens not closed */
	unsigned long (*cufile_violations)(void);	/* must stay 0 */
	void (*cufile_set_mode)(int direct);	/* 1: O_DIRECT descriptors only */
};

#define SIM_SYM(lib, field, name)					\
	(*(void **)&api->field = dlsym(lib, name), api->field != NULL)

/*
 * Loads dir/libcuda.so.1 (RTLD_GLOBAL, so that nvio finds it as the
 * process's driver) and dir/libcufile.so.0 and fills api. Returns 0, or
 * -1 with the reason in why.
 */
static inline int sim_load(struct sim_api *api, const char *dir, char *why,
			   size_t why_len)
{
	char path[4096];
	void *cu, *cf;

	snprintf(path, sizeof(path), "%s/libcuda.so.1", dir);
	cu = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!cu) {
		snprintf(why, why_len, "cannot load the CUDA simulator %s: %s "
			 "(make check builds it)", path, dlerror());
		return -1;
	}
	snprintf(path, sizeof(path), "%s/libcufile.so.0", dir);
	cf = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cf) {
		snprintf(why, why_len, "cannot load the cuFile simulator %s: %s",
			 path, dlerror());
		return -1;
	}
	if (!(SIM_SYM(cu, alloc, "sim_cuda_alloc") && SIM_SYM(cu, free, "sim_cuda_free") &&
	      SIM_SYM(cu, peek, "sim_cuda_peek") && SIM_SYM(cu, poke, "sim_cuda_poke") &&
	      SIM_SYM(cu, fill, "sim_cuda_fill") && SIM_SYM(cu, copies, "sim_cuda_copies") &&
	      SIM_SYM(cu, pageable_copies, "sim_cuda_pageable_copies") &&
	      SIM_SYM(cu, violations, "sim_cuda_violations") &&
	      SIM_SYM(cu, queued, "sim_cuda_queued") &&
	      SIM_SYM(cu, host_registered, "sim_cuda_host_registered") &&
	      SIM_SYM(cu, ctx_refs, "sim_cuda_ctx_refs") && SIM_SYM(cu, fail, "sim_cuda_fail") &&
	      SIM_SYM(cu, set_delay, "sim_cuda_set_delay") &&
	      SIM_SYM(cu, wait_idle, "sim_cuda_wait_idle") &&
	      SIM_SYM(cf, cufile_fail, "sim_cufile_fail") &&
	      SIM_SYM(cf, cufile_ios, "sim_cufile_ios") &&
	      SIM_SYM(cf, cufile_handles, "sim_cufile_handles") &&
	      SIM_SYM(cf, cufile_bufs, "sim_cufile_bufs") &&
	      SIM_SYM(cf, cufile_open_count, "sim_cufile_open_count") &&
	      SIM_SYM(cf, cufile_violations, "sim_cufile_violations") &&
	      SIM_SYM(cf, cufile_set_mode, "sim_cufile_set_mode"))) {
		snprintf(why, why_len, "the simulators in %s lack sim_* functions", dir);
		return -1;
	}
	return 0;
}
#endif

#endif

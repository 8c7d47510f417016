/*
 * cufile.c - NVIDIA cuFile (GPUDirect Storage), loaded at run time.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "internal.h"

void nvio__cufile_probe(nvio_probe_t *out)
{
	void *lib = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);

	if (!lib)
		lib = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		out->cufile_mode = NVIO_CUFILE_NONE;
		snprintf(out->cufile_why, sizeof(out->cufile_why),
			 "libcufile.so.0 not found: install nvidia-gds (apt) or "
			 "pip install nvidia-cufile-cu12 for GPUDirect Storage");
		return;
	}
	out->cufile_found = 1;
	out->cufile_mode = NVIO_CUFILE_UNKNOWN;
	snprintf(out->cufile_why, sizeof(out->cufile_why),
		 "libcufile loaded; driver not opened by the probe");
}

/*
 * consumer.c - a program that uses libnvio the way an outside user does:
 * only <nvio.h>, linked against the shared library (tests/packaging_check.sh
 * builds it with pkg-config against an installed copy, and with
 * -Lbuild -lnvio against the build tree).
 *
 *   consumer DIR    writes 1 MiB + 1 byte to DIR/consumer.bin, reads it
 *                   back, compares, removes it; exits 0 on success.
 *
 * It also checks that the library it runs against is the header's major
 * version and no older than the header (a newer minor must run it).
 */
#include <nvio.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N ((1u << 20) + 1)

static int fail(const char *what, int err)
{
	fprintf(stderr, "consumer: %s: %s\n", what, nvio_strerror(err));
	return 1;
}

int main(int argc, char **argv)
{
	char path[4096];
	nvio_config_t cfg;
	nvio_handle_t *h;
	unsigned char *out, *in;
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: consumer DIR\n");
		return 2;
	}
	if (nvio_version() >> 16 != NVIO_VERSION_MAJOR || nvio_version() < NVIO_VERSION_NUM) {
		fprintf(stderr, "consumer: header %#x, library %#x (%s)\n",
			NVIO_VERSION_NUM, nvio_version(), nvio_version_string());
		return 1;
	}
	snprintf(path, sizeof(path), "%s/consumer.bin", argv[1]);
	out = malloc(N);
	in = malloc(N);
	if (!out || !in)
		return 1;
	for (unsigned i = 0; i < N; i++)
		out[i] = (unsigned char)(i * 31 + 7);
	memset(in, 0, N);

	nvio_config_init(&cfg);
	r = nvio_handle_create(&h, &cfg);
	if (r < 0)
		return fail("nvio_handle_create", r);
	r = nvio_pwrite(h, out, N, path, 0, NVIO_ASYNC);
	if (r == 0)
		r = nvio_wait(h);
	if (r < 0)
		return fail("nvio_pwrite", r);
	r = nvio_pread(h, in, N, path, 0, 0);
	if (r < 0)
		return fail("nvio_pread", r);
	nvio_handle_destroy(h);
	unlink(path);
	if (memcmp(out, in, N)) {
		fprintf(stderr, "consumer: bytes read back differ\n");
		return 1;
	}
	printf("consumer: libnvio %s, %u bytes round trip\n", nvio_version_string(), N);
	free(out);
	free(in);
	return 0;
}

/*
 * abi_v01.c - a program built against libnvio 0.1's nvio_error_t keeps
 * working on 0.2: it calls nvio_last_error and nvio_format_error at their
 * NVIO_0.1 versions (as a 0.1 link recorded them) and gets the 0.1
 * layout, with the path where 0.1 had it. Exit 0 on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct error_v01 {
	int err;
	int is_write;
	uint64_t op_seq;
	int64_t offset;
	uint64_t nbytes;
	char what[32];
	char path[1024];
};

int nvio_handle_create(void **h, const void *cfg);
void nvio_handle_destroy(void *h);
int nvio_pread(void *h, void *buf, uint64_t n, const char *path, int64_t off,
	       unsigned flags);
int nvio_last_error(const void *h, struct error_v01 *e);
int nvio_format_error(const struct error_v01 *e, char *buf, size_t len);
__asm__(".symver nvio_last_error, nvio_last_error@NVIO_0.1");
__asm__(".symver nvio_format_error, nvio_format_error@NVIO_0.1");

int main(void)
{
	const char *path = "/nonexistent-nvio-dir/x";
	struct error_v01 e;
	char buf[8], line[1200];
	void *h;
	int r, r2;

	if (nvio_handle_create(&h, NULL) != 0)
		return 1;
	r = nvio_pread(h, buf, sizeof(buf), path, 0, 0);
	memset(&e, 0xff, sizeof(e));
	r2 = nvio_last_error(h, &e);
	nvio_format_error(&e, line, sizeof(line));
	nvio_handle_destroy(h);
	printf("pread %d, last_error %d, path %s, line: %s\n", r, r2, e.path, line);
	return !(r < 0 && r2 == r && e.err == r && !strcmp(e.path, path) &&
		 !strcmp(e.what, "open") && strstr(line, path));
}

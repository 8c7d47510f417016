/*
 * abi_v02.c - a program built against libnvio 0.2's nvio_op_t and
 * nvio_completion_t keeps working on 0.3: it calls nvio_submit,
 * nvio_reap and nvio_completion_error at their NVIO_0.2 versions (as a
 * 0.2 link recorded them) with 0.2's layouts (a 64-byte op with no
 * reserved[]; a 64-byte completion with flags after err_nbytes and a
 * 20-byte err_what) and gets its tags, byte counts and errors back where
 * 0.2 had them. Usage: abi_v02 DIR. Exit 0 on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct op_v02 {
	uint32_t opcode;
	uint32_t flags;
	void *file;
	void *buf;
	uint64_t nbytes;
	int64_t offset;
	const void *iov;
	uint32_t iovcnt;
	uint32_t reserved0;
	uint64_t user_data;
};

struct completion_v02 {
	uint64_t user_data;
	int64_t res;
	uint64_t op_seq;
	int64_t err_offset;
	uint64_t err_nbytes;
	uint32_t flags;
	char err_what[20];
};

struct error_v02 {		/* nvio_error_t, unchanged since 0.2 */
	uint32_t struct_size;
	int32_t err;
	int32_t is_write;
	uint32_t reserved0;
	uint64_t op_seq;
	int64_t offset;
	uint64_t nbytes;
	uint64_t user_data;
	char what[64];
	char path[1024];
};

int nvio_handle_create(void **h, const void *cfg);
void nvio_handle_destroy(void *h);
void *nvio_file_open(void *h, const char *path, unsigned flags, int *err);
int nvio_file_close(void *f);
int nvio_submit(void *h, const struct op_v02 *ops, unsigned n);
int nvio_reap(void *h, struct completion_v02 *out, unsigned max, unsigned min,
	      int64_t timeout_ns);
int nvio_completion_error(const struct completion_v02 *c, const char *path,
			  struct error_v02 *out);
__asm__(".symver nvio_submit, nvio_submit@NVIO_0.2");
__asm__(".symver nvio_reap, nvio_reap@NVIO_0.2");
__asm__(".symver nvio_completion_error, nvio_completion_error@NVIO_0.2");

#define N 3
#define SZ 4096

int main(int argc, char **argv)
{
	static unsigned char out[N][SZ], in[N][SZ];
	struct op_v02 ops[N];
	struct completion_v02 cs[N + 1], bad;
	struct error_v02 e = { .struct_size = sizeof(e) };
	char path[1024];
	unsigned seen = 0;
	void *h, *f;
	int err = 0, n = 0, r, ok = 1;

	snprintf(path, sizeof(path), "%s/abi_v02", argc > 1 ? argv[1] : "/tmp");
	if (nvio_handle_create(&h, NULL) != 0)
		return 1;
	f = nvio_file_open(h, path, 2 | 4, &err);	/* WRITE | CREATE */
	if (!f) {
		printf("open %s: %d\n", path, err);
		return 1;
	}
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < N; i++) {
		memset(out[i], 'a' + i, SZ);
		ops[i] = (struct op_v02){ .opcode = 2, .file = f, .buf = out[i],
					  .nbytes = SZ, .offset = i * SZ,
					  .user_data = 100 + (uint64_t)i };
	}
	r = nvio_submit(h, ops, N);
	while (r == N && n < N) {
		int k = nvio_reap(h, cs + n, N + 1 - (unsigned)n, 1, 10000000000ll);

		if (k <= 0)
			break;
		n += k;
	}
	for (int i = 0; i < n; i++) {
		if (cs[i].user_data < 100 || cs[i].user_data >= 100 + N ||
		    cs[i].res != SZ || !(cs[i].flags & 1) || cs[i].err_what[0])
			ok = 0;
		else
			seen |= 1u << (cs[i].user_data - 100);
	}
	nvio_file_close(f);
	FILE *fp = fopen(path, "rb");
	if (!fp || fread(in, 1, sizeof(in), fp) != sizeof(in) || memcmp(in, out, sizeof(in)))
		ok = 0;
	if (fp)
		fclose(fp);
	/* a failed completion in 0.2's layout makes 0.2's record */
	memset(&bad, 0, sizeof(bad));
	bad.user_data = 7;
	bad.res = -5;
	bad.err_offset = 4096;
	bad.err_nbytes = 512;
	bad.flags = 1;
	snprintf(bad.err_what, sizeof(bad.err_what), "pwrite");
	err = nvio_completion_error(&bad, path, &e);
	nvio_handle_destroy(h);
	printf("submit %d, reaped %d (tags seen %#x), completion_error %d what '%s' "
	       "offset %lld user_data %llu\n", r, n, seen, err, e.what,
	       (long long)e.offset, (unsigned long long)e.user_data);
	return !(ok && r == N && n == N && seen == (1u << N) - 1 && err == -5 &&
		 e.err == -5 && e.is_write && e.offset == 4096 && e.nbytes == 512 &&
		 e.user_data == 7 && !strcmp(e.what, "pwrite") && !strcmp(e.path, path));
}

/*
 * hk-mkfiles: the web server's content for the migration benchmark
 * (bench/migration.py; seed 003, section 4.2: 5000 files of 100 KB of
 * random bytes).
 *
 *   hk-mkfiles [-s SEED] DIR COUNT BYTES
 *
 * Writes DIR/0.bin ... DIR/(COUNT-1).bin, BYTES bytes each, of pseudo-random
 * bytes (splitmix64 seeded with SEED, default 1: the same flags give the
 * same files), then prints
 *
 *   hk-mkfiles: files=COUNT bytes=BYTES seconds=S
 *
 * A generator rather than /dev/urandom: the bytes are just as
 * incompressible and never a zero page, and the guest makes them ~10x
 * faster. Errors are one line on stderr and exit 1; bad flags exit 2.
 */
#define _GNU_SOURCE
#define PROG "hk-mkfiles"
#include "hk-tool.h"

#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

static uint64_t state;

static uint64_t splitmix64(void)
{
	uint64_t z = (state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
	long long count, bytes, i;
	size_t k;
	uint64_t *buf;
	double t0 = now();
	int opt;

	state = 1;
	while ((opt = getopt(argc, argv, "s:h")) != -1) {
		switch (opt) {
		case 's':
			state = int_arg(optarg, "-s", 0, INT64_MAX);
			break;
		case 'h':
			puts("usage: hk-mkfiles [-s SEED] DIR COUNT BYTES");
			return 0;
		default:
			fputs("usage: hk-mkfiles [-s SEED] DIR COUNT BYTES\n", stderr);
			return 2;
		}
	}
	if (argc - optind != 3)
		bad_flag("usage: hk-mkfiles [-s SEED] DIR COUNT BYTES");
	count = int_arg(argv[optind + 1], "COUNT", 1, 10000000);
	bytes = int_arg(argv[optind + 2], "BYTES", 1, 1 << 30);
	buf = malloc((bytes + 7) / 8 * 8);
	if (!buf)
		fail("out of memory");
	for (i = 0; i < count; i++) {
		char path[4096];
		int fd;
		ssize_t n;

		for (k = 0; k < (size_t)(bytes + 7) / 8; k++)
			buf[k] = splitmix64();
		snprintf(path, sizeof(path), "%s/%lld.bin", argv[optind], i);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			fail("%s: %s", path, strerror(errno));
		n = write(fd, buf, bytes);
		if (n != bytes)
			fail("%s: %s", path, n < 0 ? strerror(errno) : "short write");
		close(fd);
	}
	printf("hk-mkfiles: files=%lld bytes=%lld seconds=%.3f\n", count, bytes, now() - t0);
	return 0;
}

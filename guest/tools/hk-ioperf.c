/*
 * hk-ioperf: the guest's end of the virtio benchmark (bench/virtio.py).
 *
 *   hk-ioperf randread DEV SECONDS [BS [QD [START_MIB [SPAN_MIB]]]]
 *       O_DIRECT reads of BS bytes (default 4096) at uniformly random
 *       BS-aligned offsets within [START_MIB, START_MIB + SPAN_MIB) MiB of DEV
 *       (default: the whole device) for SECONDS, QD threads (default 1) each
 *       with one read in flight. Prints "randread iops=N ...".
 *   hk-ioperf seqread DEV MIB [BS [START_MIB]]
 *   hk-ioperf seqwrite DEV MIB [BS [START_MIB]]
 *       O_DIRECT sequential reads or writes of MIB MiB in BS-byte requests
 *       (default 1 MiB) from START_MIB MiB on (default 0). Prints
 *       "seqread mbps=N ..." or "seqwrite mbps=N ...". seqwrite ends with
 *       fdatasync (a device flush) and mbps includes it; mbps_nosync leaves
 *       it out. The data written is pseudo-random (not zeros).
 *   hk-ioperf tcpsend HOST PORT MIB
 *       Connects to the IPv4 address HOST, sends MIB MiB, half-closes and
 *       waits for the peer to close. Prints "tcpsend mbps=N ...".
 *   hk-ioperf tcprecv HOST PORT
 *       Connects, reads until the peer closes, then closes. Prints
 *       "tcprecv mbps=N bytes=N ...". Connecting retries for 10 s.
 *
 * MB/s here is 10^6 bytes per second; times come from CLOCK_MONOTONIC.
 * The host (bench/virtio.py) takes the network figures from its own end;
 * the guest's are a cross-check. Errors print a message and exit 1;
 * usage errors exit 2.
 *
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024)
#define ALIGN 4096
#define MAX_QD 64
#define NETBUF (256 * 1024)

static void die(const char *what)
{
	fprintf(stderr, "hk-ioperf: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void fail(const char *msg)
{
	fprintf(stderr, "hk-ioperf: %s\n", msg);
	exit(1);
}

static int usage(void)
{
	fprintf(stderr,
		"usage: hk-ioperf randread DEV SECONDS [BS [QD [START_MIB [SPAN_MIB]]]]\n"
		"       hk-ioperf seqread|seqwrite DEV MIB [BS [START_MIB]]\n"
		"       hk-ioperf tcpsend HOST PORT MIB | tcprecv HOST PORT\n");
	return 2;
}

static uint64_t num(const char *text)
{
	char *end;
	unsigned long long value;

	errno = 0;
	value = strtoull(text, &end, 0);
	if (*text == '\0' || *end != '\0' || errno) {
		fprintf(stderr, "hk-ioperf: '%s' is not a number\n", text);
		exit(2);
	}
	return value;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* xorshift64*: small, fast, good enough to pick offsets and fill buffers. */
static uint64_t next_rand(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

static void *aligned(size_t len)
{
	void *buf;

	if (posix_memalign(&buf, ALIGN, len)) {
		fprintf(stderr, "hk-ioperf: cannot allocate %zu bytes\n", len);
		exit(1);
	}
	memset(buf, 0, len);
	return buf;
}

/* Opens DEV with O_DIRECT and returns its size in bytes in *size. */
static int open_dev(const char *dev, int flags, uint64_t *size)
{
	struct stat st;
	int fd = open(dev, flags | O_DIRECT);

	if (fd < 0)
		die(dev);
	if (fstat(fd, &st))
		die(dev);
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, size))
			die("BLKGETSIZE64");
	} else {
		*size = st.st_size;
	}
	return fd;
}

static uint64_t check_bs(uint64_t bs)
{
	if (bs == 0 || bs % 512 || bs > 64 * MIB) {
		fprintf(stderr, "hk-ioperf: block size %llu is not a multiple of 512 "
			"up to 64 MiB\n", (unsigned long long)bs);
		exit(2);
	}
	return bs;
}

/* ---- randread ---- */

struct reader {
	pthread_t thread;
	int fd;
	uint64_t bs, start, blocks, ops, seed;
	double deadline;
	int err;
};

static void *reader_run(void *arg)
{
	struct reader *r = arg;
	char *buf = aligned(r->bs);
	uint64_t state = r->seed;

	while (now() < r->deadline) {
		off_t off = r->start + next_rand(&state) % r->blocks * r->bs;

		if (pread(r->fd, buf, r->bs, off) != (ssize_t)r->bs) {
			r->err = errno ? errno : EIO;
			break;
		}
		r->ops++;
	}
	free(buf);
	return NULL;
}

static int randread(int argc, char **argv)
{
	struct reader readers[MAX_QD];
	uint64_t size, ops = 0, seconds, bs, qd, start, span;
	double t0, elapsed;
	int fd, i;

	if (argc < 4 || argc > 8)
		return usage();
	seconds = num(argv[3]);
	bs = check_bs(argc > 4 ? num(argv[4]) : 4096);
	qd = argc > 5 ? num(argv[5]) : 1;
	if (qd < 1 || qd > MAX_QD)
		fail("QD must be 1-64");
	fd = open_dev(argv[2], O_RDONLY, &size);
	start = argc > 6 ? num(argv[6]) * MIB : 0;
	span = argc > 7 ? num(argv[7]) * MIB : size - (start < size ? start : size);
	if (start + span > size || span < bs)
		fail("the region does not fit the device");
	t0 = now();
	for (i = 0; i < (int)qd; i++) {
		struct reader *r = &readers[i];

		memset(r, 0, sizeof(*r));
		r->fd = fd;
		r->bs = bs;
		r->start = start;
		r->blocks = span / bs;
		r->seed = ((uint64_t)t0 * 1000003 + i + 1) * 0x9E3779B97F4A7C15ULL | 1;
		r->deadline = t0 + seconds;
		errno = pthread_create(&r->thread, NULL, reader_run, r);
		if (errno)
			die("pthread_create");
	}
	for (i = 0; i < (int)qd; i++) {
		pthread_join(readers[i].thread, NULL);
		if (readers[i].err) {
			errno = readers[i].err;
			die("read");
		}
		ops += readers[i].ops;
	}
	elapsed = now() - t0;
	printf("randread iops=%.0f ops=%llu seconds=%.3f bs=%llu qd=%llu\n",
	       ops / elapsed, (unsigned long long)ops, elapsed,
	       (unsigned long long)bs, (unsigned long long)qd);
	return 0;
}

/* ---- seqread / seqwrite ---- */

static int seq(int argc, char **argv, int write)
{
	uint64_t size, mib, bs, start, total, done, state = 0x1234567890abcdefULL;
	double t0, t1, t2;
	char *buf;
	int fd;

	if (argc < 4 || argc > 6)
		return usage();
	mib = num(argv[3]);
	bs = check_bs(argc > 4 ? num(argv[4]) : MIB);
	start = argc > 5 ? num(argv[5]) * MIB : 0;
	fd = open_dev(argv[2], write ? O_WRONLY : O_RDONLY, &size);
	total = mib * MIB;
	if (total == 0 || total % bs || start + total > size)
		fail("MIB must be a non-zero multiple of BS that fits the device");
	buf = aligned(bs);
	for (done = 0; write && done < bs; done += 8) {
		uint64_t x = next_rand(&state);

		memcpy(buf + done, &x, 8);
	}
	t0 = now();
	for (done = 0; done < total; done += bs) {
		ssize_t n;

		if (write) {
			/* Each block differs: its offset in its first 8 bytes. */
			memcpy(buf, &done, 8);
			n = pwrite(fd, buf, bs, start + done);
		} else {
			n = pread(fd, buf, bs, start + done);
		}
		if (n != (ssize_t)bs) {
			if (n >= 0)
				errno = EIO;
			die(write ? "write" : "read");
		}
	}
	t1 = now();
	if (!write) {
		printf("seqread mbps=%.1f bytes=%llu seconds=%.3f bs=%llu\n",
		       total / 1e6 / (t1 - t0), (unsigned long long)total, t1 - t0,
		       (unsigned long long)bs);
		return 0;
	}
	if (fdatasync(fd))
		die("fdatasync");
	t2 = now();
	printf("seqwrite mbps=%.1f bytes=%llu seconds=%.3f bs=%llu mbps_nosync=%.1f "
	       "sync_seconds=%.3f\n", total / 1e6 / (t2 - t0), (unsigned long long)total,
	       t2 - t0, (unsigned long long)bs, total / 1e6 / (t1 - t0), t2 - t1);
	return 0;
}

/* ---- tcpsend / tcprecv ---- */

static int tcp_connect(const char *host, const char *port)
{
	struct sockaddr_in sa;
	double deadline = now() + 10;
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)num(port));
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		fail("HOST must be an IPv4 address");
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			die("socket");
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		if (now() > deadline)
			die("connect");
		close(fd);
		usleep(100000);
	}
}

static int tcp(int argc, char **argv, int send)
{
	uint64_t total = 0, want = 0;
	double t0, t1;
	char *buf;
	ssize_t n;
	int fd;

	if (argc != (send ? 5 : 4))
		return usage();
	if (send)
		want = num(argv[4]) * MIB;
	buf = aligned(NETBUF);
	fd = tcp_connect(argv[2], argv[3]);
	t0 = now();
	while (send && total < want) {
		size_t len = want - total < NETBUF ? want - total : NETBUF;

		n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("send");
		total += n;
	}
	if (send && shutdown(fd, SHUT_WR))
		die("shutdown");
	/* tcprecv: the data; tcpsend: the peer's close after it got everything. */
	while ((n = read(fd, buf, NETBUF)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("receive");
		if (!send)
			total += n;
	}
	t1 = now();
	close(fd);
	printf("%s mbps=%.1f bytes=%llu seconds=%.3f\n", send ? "tcpsend" : "tcprecv",
	       total / 1e6 / (t1 - t0), (unsigned long long)total, t1 - t0);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return usage();
	if (!strcmp(argv[1], "randread"))
		return randread(argc, argv);
	if (!strcmp(argv[1], "seqread"))
		return seq(argc, argv, 0);
	if (!strcmp(argv[1], "seqwrite"))
		return seq(argc, argv, 1);
	if (!strcmp(argv[1], "tcpsend"))
		return tcp(argc, argv, 1);
	if (!strcmp(argv[1], "tcprecv"))
		return tcp(argc, argv, 0);
	return usage();
}

/*
 * hk-sptbench: a memory-heavy multi-process workload with frequent process
 * switches, for the shadow-paging benchmark (bench/spt.py; seed 001).
 *
 *   hk-sptbench [-p PROCS] [-m MIB] [-t SECONDS] [-w WARMUP_PASSES]
 *
 * PROCS processes (default 16) each fault in MIB MiB (default 16) of private
 * memory, then pass a token around a ring of pipes. On every turn a process
 * writes one byte in every 4 KiB page of its set, then hands the token on:
 * every pass is a process switch to an address space with a large resident
 * set. Under shadow paging each switch needs the next process's shadow page
 * tables: cached (enough shadow pages) or rebuilt (too few).
 *
 * After WARMUP_PASSES token passes (default 2 rounds of the ring), runs for
 * SECONDS (default 5) and prints one line:
 *   hk-sptbench procs=16 mib=16 passes=N seconds=S passes_per_s=X pages_per_s=Y
 *
 * Static (gcc -static) so the same binary runs in the guest and natively.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STOP UINT64_MAX

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long number(const char *text, const char *what)
{
	char *end;
	long v = strtol(text, &end, 10);

	if (*text == '\0' || *end != '\0' || v <= 0) {
		fprintf(stderr, "hk-sptbench: %s '%s' is not a positive number\n", what, text);
		exit(2);
	}
	return v;
}

static int read_full(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len > 0) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

/* One ring member: reads the token from `in`, touches its pages, writes
 * token + 1 to `out`. Member 0 also keeps time and ends the run. */
static void member(int index, int in, int out, size_t bytes, int procs, long seconds,
		   long warmup, int ready)
{
	unsigned char *set = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t pages = bytes / 4096;
	uint64_t token, start_token = 0;
	double start = 0;
	unsigned char round = 0;

	if (set == MAP_FAILED) {
		perror("hk-sptbench: mmap");
		exit(1);
	}
	for (size_t i = 0; i < pages; i++)
		set[i * 4096] = 1;
	if (write_full(ready, "r", 1) < 0)
		exit(1);
	for (;;) {
		if (read_full(in, &token, sizeof(token)) < 0)
			exit(1);
		if (token == STOP) {
			write_full(out, &token, sizeof(token));
			exit(0);
		}
		round++;
		for (size_t i = 0; i < pages; i++)
			set[i * 4096] += round;
		if (index == 0) {
			/* Member 0 sees every PROCS-th token: start at the first
			 * one past the warm-up, whatever WARMUP_PASSES is. */
			if (start_token == 0 && token >= (uint64_t)warmup) {
				start = now();
				start_token = token;
			} else if (start_token != 0 && now() - start >= seconds) {
				double elapsed = now() - start;
				uint64_t passes = token - start_token;

				printf("hk-sptbench procs=%d mib=%zu passes=%llu seconds=%.3f "
				       "passes_per_s=%.1f pages_per_s=%.0f\n",
				       procs, bytes >> 20, (unsigned long long)passes, elapsed,
				       passes / elapsed, passes * (double)pages / elapsed);
				fflush(stdout);
				token = STOP;
				write_full(out, &token, sizeof(token));
				/* Wait for the STOP to come round, then leave. */
				read_full(in, &token, sizeof(token));
				exit(0);
			}
		}
		token++;
		if (write_full(out, &token, sizeof(token)) < 0)
			exit(1);
	}
}

int main(int argc, char **argv)
{
	long procs = 16, mib = 16, seconds = 5, warmup = -1;
	int opt, status = 0;
	int ready[2];
	int (*pipes)[2];

	while ((opt = getopt(argc, argv, "p:m:t:w:")) != -1) {
		switch (opt) {
		case 'p': procs = number(optarg, "-p"); break;
		case 'm': mib = number(optarg, "-m"); break;
		case 't': seconds = number(optarg, "-t"); break;
		case 'w': warmup = number(optarg, "-w"); break;
		default:
			fprintf(stderr, "usage: hk-sptbench [-p PROCS] [-m MIB] [-t SECONDS] [-w WARMUP_PASSES]\n");
			return 2;
		}
	}
	if (procs > 1024) {
		fprintf(stderr, "hk-sptbench: at most 1024 processes\n");
		return 2;
	}
	if (warmup < 0)
		warmup = 2 * procs;
	pipes = calloc(procs, sizeof(*pipes));
	if (!pipes || pipe(ready) < 0) {
		perror("hk-sptbench");
		return 1;
	}
	for (long i = 0; i < procs; i++) {
		if (pipe(pipes[i]) < 0) {
			perror("hk-sptbench: pipe");
			return 1;
		}
	}
	for (long i = 0; i < procs; i++) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("hk-sptbench: fork");
			kill(0, SIGKILL);
			return 1;
		}
		if (pid == 0) {
			int in = pipes[i][0], out = pipes[(i + 1) % procs][1];

			for (long j = 0; j < procs; j++) {
				if (pipes[j][0] != in)
					close(pipes[j][0]);
				if (pipes[j][1] != out)
					close(pipes[j][1]);
			}
			close(ready[0]);
			member(i, in, out, (size_t)mib << 20, procs, seconds, warmup, ready[1]);
		}
	}
	close(ready[1]);
	for (long i = 0; i < procs; i++) {
		char c;

		if (read_full(ready[0], &c, 1) < 0) {
			fprintf(stderr, "hk-sptbench: a process died while faulting in its memory\n");
			kill(0, SIGKILL);
			return 1;
		}
	}
	uint64_t token = 0;

	if (write_full(pipes[0][1], &token, sizeof(token)) < 0)
		return 1;
	for (long i = 0; i < procs; i++) {
		close(pipes[i][0]);
		close(pipes[i][1]);
	}
	for (long i = 0; i < procs; i++) {
		int s;

		if (wait(&s) > 0 && !(WIFEXITED(s) && WEXITSTATUS(s) == 0))
			status = 1;
	}
	return status;
}

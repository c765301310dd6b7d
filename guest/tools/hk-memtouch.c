/*
 * hk-memtouch: the memory workloads of the migration benchmark
 * (bench/migration.py; seed 003, sections 4.1 and the precopy rows).
 *
 *   hk-memtouch [-t THREADS] [-m MIB] [-s STRIDE] [-P MARKS] [-g]
 *   hk-memtouch -d [-m MIB] [-r PAGES_PER_S] [-T SECONDS]
 *
 * Touch mode (the paper's 4.1 micro-benchmark): THREADS threads (default 4)
 * each allocate MIB MiB (default 200) and fill it (every 4 KiB page with
 * its own non-zero byte value, so no page is a zero page and each thread
 * can check its area later). When all are filled it prints
 *
 *   hk-memtouch: ready threads=T mib=M
 *
 * and waits for a line on stdin (-g: starts at once). At that line (the
 * migration's switch-over, in the benchmark) every thread reads its area
 * from start to end, one byte every STRIDE bytes (default 1: byte by byte),
 * summing the bytes, and stops its clock at the end. Then, per thread:
 *
 *   thread N seconds=S start=S0 check=ok|bad marks=t1,t2,...,tMARKS
 *
 * S: go line -> the thread's last byte; S0: go line -> the thread's first
 * byte; marks: seconds from the go line at which the thread had read each
 * 1/MARKS of its area (default 20); check: the bytes read sum to what was
 * written. Last line:
 *
 *   hk-memtouch: done threads=T mib=M stride=B max=S mean=S check=ok|bad
 *
 * before which one line gives the guest kernel's counters over the same
 * time (go line to the last thread's end): context switches (ctxt of
 * /proc/stat), KVM async-PF "page ready" interrupts (HYP of
 * /proc/interrupts, which counts them) and local timer interrupts (LOC):
 *
 *   hk-memtouch: guest ctxt=N hyp_irqs=N timer_irqs=N
 *
 * Dirty mode (-d, the precopy workload): fills MIB MiB (default 64), prints
 * "hk-memtouch: ready dirty mib=M", then writes one byte in every page of
 * it in turn, over and over: PAGES_PER_S pages a second (-r, default 0: as
 * fast as it can), for SECONDS (-T, default 0: until killed). Each second
 * it adds up what it dirtied; at the end (time limit or SIGTERM/SIGINT):
 *
 *   hk-memtouch: dirtied pages=N seconds=S pages_per_s=R
 *
 * Errors are one line on stderr and exit 1; bad flags exit 2.
 */
#define _GNU_SOURCE
#define PROG "hk-memtouch"
#include "hk-tool.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096UL
#define MAX_THREADS 64
#define MAX_MARKS 1000

struct toucher {
	pthread_t thread;
	int index;
	unsigned char *area;
	size_t bytes;
	uint64_t expect; /* what the bytes read sum to */
	double start, end;
	double *marks;
	int check_ok;
};

static size_t stride = 1;
static int nmarks = 20;

/* Synchronisation: all filled -> main; go -> all. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int filled;
static int go;
static double t_go;

/* The value of every byte of page P of thread T's area: never zero. */
static unsigned char page_value(int t, size_t p)
{
	return (unsigned char)(1 + (t * 131 + p) % 251);
}

static unsigned char *alloc_area(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		fail("cannot allocate %zu MiB: %s", bytes >> 20, strerror(errno));
	return p;
}

/* Fills the area and works out what reading it with the stride sums to. */
static void fill(struct toucher *w)
{
	size_t pages = w->bytes / PAGE, p;

	w->expect = 0;
	for (p = 0; p < pages; p++) {
		unsigned char v = page_value(w->index, p);
		size_t first = (p * PAGE + stride - 1) / stride * stride, n = 0;

		memset(w->area + p * PAGE, v, PAGE);
		if (first < (p + 1) * PAGE)
			n = ((p + 1) * PAGE - 1 - first) / stride + 1;
		w->expect += (uint64_t)v * n;
	}
}

static void *touch_run(void *arg)
{
	struct toucher *w = arg;
	const unsigned char *a = w->area;
	size_t i = 0, chunk = w->bytes / nmarks, next_mark = chunk;
	uint64_t sum = 0;
	int m = 0;

	fill(w);
	pthread_mutex_lock(&lock);
	filled++;
	pthread_cond_broadcast(&cond);
	while (!go)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);

	w->start = now() - t_go;
	while (i < w->bytes) {
		size_t end = next_mark < w->bytes ? next_mark : w->bytes;

		for (; i < end; i += stride)
			sum += a[i];
		if (m < nmarks)
			w->marks[m++] = now() - t_go;
		next_mark += chunk;
	}
	while (m < nmarks)
		w->marks[m++] = now() - t_go;
	w->end = now() - t_go;
	w->check_ok = sum == w->expect;
	return NULL;
}

/* The sum of the numbers after the line starting (after blanks) with KEY
 * in FILE: "ctxt" in /proc/stat, "HYP:" in /proc/interrupts (one column
 * per CPU); -1 if there is no such line. */
static long long counter(const char *file, const char *key)
{
	char line[4096];
	long long sum = -1;
	FILE *f = fopen(file, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char *p = line, *end;

		while (*p == ' ')
			p++;
		if (strncmp(p, key, strlen(key)) != 0)
			continue;
		p += strlen(key);
		sum = 0;
		for (;;) {
			long long v = strtoll(p, &end, 10);

			if (end == p)
				break;
			sum += v;
			p = end;
		}
		break;
	}
	fclose(f);
	return sum;
}

static long long delta(long long after, long long before)
{
	return after < 0 || before < 0 ? -1 : after - before;
}

static void touch_mode(int threads, size_t mib, int start_at_once)
{
	struct toucher w[MAX_THREADS];
	char line[64];
	double max = 0, total = 0;
	long long ctxt0, hyp0, loc0;
	int i, all_ok = 1;

	for (i = 0; i < threads; i++) {
		w[i].index = i;
		w[i].bytes = mib << 20;
		w[i].area = alloc_area(w[i].bytes);
		w[i].marks = calloc(nmarks, sizeof(double));
		if (!w[i].marks)
			fail("out of memory");
		errno = pthread_create(&w[i].thread, NULL, touch_run, &w[i]);
		if (errno)
			fail("pthread_create: %s", strerror(errno));
	}
	pthread_mutex_lock(&lock);
	while (filled < threads)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
	printf("hk-memtouch: ready threads=%d mib=%zu\n", threads, mib);
	fflush(stdout);
	if (!start_at_once && !fgets(line, sizeof(line), stdin))
		fail("stdin ended before the go line");

	ctxt0 = counter("/proc/stat", "ctxt");
	hyp0 = counter("/proc/interrupts", "HYP:");
	loc0 = counter("/proc/interrupts", "LOC:");
	pthread_mutex_lock(&lock);
	t_go = now();
	go = 1;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	for (i = 0; i < threads; i++)
		pthread_join(w[i].thread, NULL);
	printf("hk-memtouch: guest ctxt=%lld hyp_irqs=%lld timer_irqs=%lld\n",
	       delta(counter("/proc/stat", "ctxt"), ctxt0),
	       delta(counter("/proc/interrupts", "HYP:"), hyp0),
	       delta(counter("/proc/interrupts", "LOC:"), loc0));

	for (i = 0; i < threads; i++) {
		int m;

		printf("thread %d seconds=%.3f start=%.3f check=%s marks=", i, w[i].end, w[i].start,
		       w[i].check_ok ? "ok" : "bad");
		for (m = 0; m < nmarks; m++)
			printf("%s%.3f", m ? "," : "", w[i].marks[m]);
		printf("\n");
		if (w[i].end > max)
			max = w[i].end;
		total += w[i].end;
		all_ok &= w[i].check_ok;
	}
	printf("hk-memtouch: done threads=%d mib=%zu stride=%zu max=%.3f mean=%.3f check=%s\n",
	       threads, mib, stride, max, total / threads, all_ok ? "ok" : "bad");
	fflush(stdout);
	if (!all_ok)
		exit(1);
}

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void dirty_mode(size_t mib, double rate, double seconds)
{
	size_t pages = (mib << 20) / PAGE, p = 0;
	unsigned char *a = alloc_area(mib << 20);
	uint64_t dirtied = 0;
	double t0, t;
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	for (p = 0; p < pages; p++)
		memset(a + p * PAGE, page_value(0, p), PAGE);
	printf("hk-memtouch: ready dirty mib=%zu\n", mib);
	fflush(stdout);
	t0 = now();
	p = 0;
	while (!stop) {
		/* A batch of up to 10 ms worth of pages, then a wait for its due time. */
		size_t batch = rate > 0 ? (size_t)(rate / 100) + 1 : 4096, k;

		for (k = 0; k < batch; k++) {
			a[p * PAGE + (dirtied / pages) % PAGE]++;
			p = p + 1 == pages ? 0 : p + 1;
			dirtied++;
		}
		t = now();
		if (seconds > 0 && t - t0 >= seconds)
			break;
		if (rate > 0 && dirtied / rate > t - t0)
			sleep_until(t0 + dirtied / rate);
	}
	t = now() - t0;
	printf("hk-memtouch: dirtied pages=%llu seconds=%.3f pages_per_s=%.0f\n",
	       (unsigned long long)dirtied, t, t > 0 ? dirtied / t : 0);
	fflush(stdout);
}

static void usage(FILE *f)
{
	fputs("usage: hk-memtouch [-t THREADS] [-m MIB] [-s STRIDE] [-P MARKS] [-g]\n"
	      "       hk-memtouch -d [-m MIB] [-r PAGES_PER_S] [-T SECONDS]\n",
	      f);
}

int main(int argc, char **argv)
{
	int opt, threads = 4, dirty = 0, start_at_once = 0;
	long long mib = -1;
	double rate = 0, seconds = 0;

	while ((opt = getopt(argc, argv, "t:m:s:P:gdr:T:h")) != -1) {
		switch (opt) {
		case 't':
			threads = int_arg(optarg, "-t", 1, MAX_THREADS);
			break;
		case 'm':
			mib = int_arg(optarg, "-m", 1, 1 << 20);
			break;
		case 's':
			stride = int_arg(optarg, "-s", 1, PAGE);
			break;
		case 'P':
			nmarks = int_arg(optarg, "-P", 1, MAX_MARKS);
			break;
		case 'g':
			start_at_once = 1;
			break;
		case 'd':
			dirty = 1;
			break;
		case 'r':
			rate = num_arg(optarg, "-r");
			break;
		case 'T':
			seconds = num_arg(optarg, "-T");
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc)
		bad_flag("unexpected argument '%s'", argv[optind]);
	if (dirty)
		dirty_mode(mib > 0 ? (size_t)mib : 64, rate, seconds);
	else
		touch_mode(threads, mib > 0 ? (size_t)mib : 200, start_at_once);
	return 0;
}

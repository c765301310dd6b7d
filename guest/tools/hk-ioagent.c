/*
 * hk-ioagent: the guest end of hakoniwa's I/O tracer (docs/iotrace.md,
 * "The application layer and the guest agent"). It runs in the Debian
 * guest (hk-ioagent.service) and listens on AF_VSOCK port 5002 of any CID;
 * the VMM reaches it through the --vsock Unix socket (`CONNECT 5002`).
 *
 * Per connection: read ONE request line, write ONE JSON object line, close.
 *
 *   report [pid=P]... [comm=NAME]... [dev=/dev/vdX]...
 *
 * answers
 *
 *   {"agent":"hk-ioagent 1","meminfo":{...},"processes":[...],"devices":[...]}
 *
 * - meminfo: MemTotal, MemAvailable, Cached, SwapTotal, SwapFree (KiB);
 * - processes: each pid=P (or {"pid":P,"error":"no such process"}) and every
 *   live process whose comm is a comm=NAME: /proc/PID/io's rchar, wchar,
 *   syscr, syscw, read_bytes, write_bytes, and its open regular-file
 *   descriptors with and without O_DIRECT. The kernel adds a reaped child's
 *   I/O to its parent's /proc/PID/io (wait_task_zombie), so naming the shell
 *   that runs a workload counts the whole workload once it has been waited
 *   for;
 * - devices: which 4 KiB pages of the disk dev=/dev/vdX the guest's page
 *   cache holds, as [first_page, count] runs: mincore of a read-only shared
 *   mapping of the block device (its own cache: raw reads, file system
 *   metadata) united with, for every regular file of every file system
 *   mounted from the disk or one of its partitions, the file's resident
 *   pages (mincore) placed on the disk by FIEMAP (extents unwritten, inline,
 *   delayed or unknown are skipped).
 *
 * `hk-ioagent --stdio` answers one request from stdin on stdout instead.
 *
 * Anything wrong is one line {"error":"..."}. Every size is bounded: the
 * request line (MAX_LINE), the words (MAX_WORDS), the processes listed
 * (MAX_PROCS), the disk (MAX_DISK_BYTES: its bitmap) and the answer
 * (MAX_ANSWER). It never follows a symlink while walking, stays on each file
 * system, and skips a process or a file that vanishes meanwhile.
 *
 * Built static (gcc -static -Os -s -Wall -Werror) by
 * scripts/build-guest-debian.
 */
#define _GNU_SOURCE
#define PROG "hk-ioagent"
#include "hk-tool.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/vm_sockets.h>

/* The wire format; the VMM's side is crates/vmm/src/iotrace/agent.rs. */
#define AGENT_PORT 5002
/* Answers being written at once (one process each). */
#define MAX_ANSWERING 4
#define AGENT_NAME "hk-ioagent 1"
#define MAX_LINE 4096
#define MAX_WORDS 64
#define MAX_PROCS 1024
#define MAX_ANSWER (16u << 20)
#define MAX_DISK_BYTES (1ull << 40) /* 1 TiB: a 32 MiB bitmap */
#define PAGE 4096ull
/* mincore's vector, in pages per call. */
#define CHUNK_PAGES 16384ull
#define O_DIRECT_FLAG 040000

/* ---- the answer: a bounded growing buffer ---- */

static char *out;
static size_t out_len, out_cap;
static int out_full;

static void put_raw(const char *s, size_t n)
{
	if (out_full)
		return;
	if (out_len + n + 1 > out_cap) {
		size_t cap = out_cap ? out_cap : 65536;
		char *grown;

		while (cap < out_len + n + 1)
			cap *= 2;
		if (cap > MAX_ANSWER) {
			out_full = 1;
			return;
		}
		grown = realloc(out, cap);
		if (!grown) {
			out_full = 1;
			return;
		}
		out = grown;
		out_cap = cap;
	}
	memcpy(out + out_len, s, n);
	out_len += n;
	out[out_len] = '\0';
}

static void put(const char *s)
{
	put_raw(s, strlen(s));
}

static void putf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void putf(const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n > 0)
		put_raw(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* A JSON string: quotes, backslashes, control characters and bytes above
 * 0x7f escaped (the last as \u00XX, so the answer is always ASCII). */
static void put_string(const char *s)
{
	put("\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			putf("\\%c", c);
		else if (c < 0x20 || c > 0x7e)
			putf("\\u%04x", c);
		else
			put_raw((const char *)&c, 1);
	}
	put("\"");
}

/* The whole answer is one error line. */
static void answer_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void answer_error(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	out_len = 0;
	out_full = 0;
	put("{\"error\":");
	put_string(buf);
	put("}\n");
}

/* ---- small file readers ---- */

/* Reads up to size-1 bytes of path into buf; -1 if it cannot. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n, total = 0;

	if (fd < 0)
		return -1;
	while ((size_t)total < size - 1) {
		n = read(fd, buf + total, size - 1 - total);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		total += n;
	}
	close(fd);
	buf[total] = '\0';
	return total;
}

/* The value after "key" (e.g. "rchar:") at a line's start in text, or -1. */
static long long field(const char *text, const char *key)
{
	size_t len = strlen(key);
	const char *p = text;

	while (p && *p) {
		if (strncmp(p, key, len) == 0)
			return strtoll(p + len, NULL, 10);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -1;
}

static long long nonneg(long long v)
{
	return v < 0 ? 0 : v;
}

/* ---- meminfo ---- */

static void put_meminfo(void)
{
	char buf[8192];

	if (read_small("/proc/meminfo", buf, sizeof buf) < 0)
		buf[0] = '\0';
	putf("\"meminfo\":{\"mem_total_kib\":%lld,\"mem_available_kib\":%lld,"
	     "\"cached_kib\":%lld,\"swap_total_kib\":%lld,\"swap_free_kib\":%lld}",
	     nonneg(field(buf, "MemTotal:")), nonneg(field(buf, "MemAvailable:")),
	     nonneg(field(buf, "Cached:")), nonneg(field(buf, "SwapTotal:")),
	     nonneg(field(buf, "SwapFree:")));
}

/* ---- processes ---- */

static int listed[MAX_PROCS];
static int nlisted;
static int first_process;

static int already_listed(int pid)
{
	for (int i = 0; i < nlisted; i++)
		if (listed[i] == pid)
			return 1;
	return 0;
}

/* A process's comm (without its newline) into comm; -1 if it is gone. */
static int read_comm(int pid, char *comm, size_t size)
{
	char path[64];
	ssize_t n;

	snprintf(path, sizeof path, "/proc/%d/comm", pid);
	n = read_small(path, comm, size);
	if (n <= 0)
		return -1;
	if (comm[n - 1] == '\n')
		comm[n - 1] = '\0';
	return 0;
}

/* Its open regular files with and without O_DIRECT. */
static void count_fds(int pid, long *direct, long *buffered)
{
	char path[64], entry[320], info[1024];
	struct dirent *d;
	struct stat st;
	DIR *dir;

	*direct = *buffered = 0;
	snprintf(path, sizeof path, "/proc/%d/fd", pid);
	dir = opendir(path);
	if (!dir)
		return;
	while ((d = readdir(dir))) {
		const char *flags;

		if (!isdigit((unsigned char)d->d_name[0]))
			continue;
		snprintf(entry, sizeof entry, "/proc/%d/fd/%s", pid, d->d_name);
		if (stat(entry, &st) || !S_ISREG(st.st_mode))
			continue;
		snprintf(entry, sizeof entry, "/proc/%d/fdinfo/%s", pid, d->d_name);
		if (read_small(entry, info, sizeof info) <= 0)
			continue;
		flags = strstr(info, "flags:");
		if (!flags)
			continue;
		if (strtoul(flags + 6, NULL, 8) & O_DIRECT_FLAG)
			(*direct)++;
		else
			(*buffered)++;
	}
	closedir(dir);
}

/* One process's entry; 0 if it is gone (nothing written, unless it was
 * named by pid: then an error entry). */
static int put_process(int pid, int named)
{
	char path[64], comm[64], io[2048];
	long direct, buffered;

	if (nlisted >= MAX_PROCS || already_listed(pid))
		return 0;
	snprintf(path, sizeof path, "/proc/%d/io", pid);
	if (read_comm(pid, comm, sizeof comm) || read_small(path, io, sizeof io) <= 0 ||
	    field(io, "rchar:") < 0) {
		if (named) {
			putf("%s{\"pid\":%d,\"error\":\"%s\"}", first_process ? "" : ",", pid,
			     kill(pid, 0) && errno == ESRCH ? "no such process"
							   : "cannot read its /proc/PID/io");
			first_process = 0;
			listed[nlisted++] = pid;
		}
		return 0;
	}
	count_fds(pid, &direct, &buffered);
	put(first_process ? "{" : ",{");
	first_process = 0;
	putf("\"pid\":%d,\"comm\":", pid);
	put_string(comm);
	putf(",\"rchar\":%lld,\"wchar\":%lld,\"syscr\":%lld,\"syscw\":%lld", nonneg(field(io, "rchar:")),
	     nonneg(field(io, "wchar:")), nonneg(field(io, "syscr:")), nonneg(field(io, "syscw:")));
	putf(",\"read_bytes\":%lld,\"write_bytes\":%lld,\"direct_fds\":%ld,\"buffered_fds\":%ld}",
	     nonneg(field(io, "read_bytes:")), nonneg(field(io, "write_bytes:")), direct, buffered);
	listed[nlisted++] = pid;
	return 1;
}

/* Every live process whose comm is one of comms[0..n). */
static void put_processes_named(char **comms, int n)
{
	struct dirent *d;
	DIR *proc;
	char comm[64];

	if (n == 0)
		return;
	proc = opendir("/proc");
	if (!proc)
		return;
	while ((d = readdir(proc))) {
		char *end;
		long pid = strtol(d->d_name, &end, 10);

		if (*end || pid <= 0 || pid > INT_MAX || read_comm((int)pid, comm, sizeof comm))
			continue;
		for (int i = 0; i < n; i++)
			if (strcmp(comm, comms[i]) == 0) {
				put_process((int)pid, 0);
				break;
			}
	}
	closedir(proc);
}

/* ---- devices: the guest page cache's residency of a disk ---- */

static uint8_t *bitmap; /* one bit per disk page */
static uint64_t disk_pages;
static unsigned char vec[CHUNK_PAGES];
/* The file system being walked: its device, and where it starts on the
 * disk (a partition's offset), in pages. */
static dev_t walk_dev;
static uint64_t walk_start_page;

static void mark(uint64_t page)
{
	if (page < disk_pages)
		bitmap[page / 8] |= (uint8_t)(1u << (page % 8));
}

/* Marks the resident pages of [addr + first*PAGE, +count pages) of a
 * mapping as disk pages from disk_first on. */
static void mark_resident(const char *addr, uint64_t first, uint64_t count, uint64_t disk_first)
{
	while (count > 0) {
		uint64_t n = count < CHUNK_PAGES ? count : CHUNK_PAGES;

		if (mincore((void *)(addr + first * PAGE), n * PAGE, vec) == 0)
			for (uint64_t i = 0; i < n; i++)
				if (vec[i] & 1)
					mark(disk_first + i);
		first += n;
		disk_first += n;
		count -= n;
	}
}

/* One extent of a file whose blocks are smaller than a page, or not
 * page-aligned on the disk: each resident file page marks every disk page
 * its bytes in the extent touch. */
static void mark_unaligned(const char *addr, uint64_t logical, uint64_t physical, uint64_t length,
			   uint64_t file_pages)
{
	uint64_t first = logical / PAGE, last = (logical + length + PAGE - 1) / PAGE;

	if (last > file_pages)
		last = file_pages;
	while (first < last) {
		uint64_t n = last - first < CHUNK_PAGES ? last - first : CHUNK_PAGES;

		if (mincore((void *)(addr + first * PAGE), n * PAGE, vec) == 0)
			for (uint64_t i = 0; i < n; i++) {
				uint64_t from = (first + i) * PAGE, to = from + PAGE;

				if (!(vec[i] & 1))
					continue;
				if (from < logical)
					from = logical;
				if (to > logical + length)
					to = logical + length;
				for (uint64_t b = physical + (from - logical);
				     b < physical + (to - logical); b = (b / PAGE + 1) * PAGE)
					mark(walk_start_page + b / PAGE);
			}
		first += n;
	}
}

/* FIEMAP's extents of one file; its resident pages placed on the disk. */
static void mark_file(int fd, const char *addr, uint64_t size)
{
	enum { EXTENTS = 64 };
	union {
		struct fiemap map;
		char bytes[sizeof(struct fiemap) + EXTENTS * sizeof(struct fiemap_extent)];
	} u;
	uint64_t start = 0, file_pages = (size + PAGE - 1) / PAGE;
	const uint32_t skip = FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC |
			      FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED |
			      FIEMAP_EXTENT_NOT_ALIGNED | FIEMAP_EXTENT_DATA_INLINE |
			      FIEMAP_EXTENT_DATA_TAIL | FIEMAP_EXTENT_UNWRITTEN;

	while (start < size) {
		memset(&u, 0, sizeof u);
		u.map.fm_start = start;
		u.map.fm_length = size - start;
		u.map.fm_extent_count = EXTENTS;
		if (ioctl(fd, FS_IOC_FIEMAP, &u.map) || u.map.fm_mapped_extents == 0)
			return;
		for (uint32_t i = 0; i < u.map.fm_mapped_extents; i++) {
			const struct fiemap_extent *e = &u.map.fm_extents[i];
			uint64_t first, last;

			if (e->fe_logical + e->fe_length <= start) /* no progress */
				return;
			start = e->fe_logical + e->fe_length;
			if (e->fe_flags & skip)
				continue;
			if (e->fe_logical % PAGE || e->fe_physical % PAGE || e->fe_length % PAGE) {
				mark_unaligned(addr, e->fe_logical, e->fe_physical, e->fe_length,
					       file_pages);
				continue;
			}
			first = e->fe_logical / PAGE;
			last = (e->fe_logical + e->fe_length + PAGE - 1) / PAGE;
			if (last > file_pages)
				last = file_pages;
			if (first < last)
				mark_resident(addr, first, last - first,
					      walk_start_page + e->fe_physical / PAGE);
			if (e->fe_flags & FIEMAP_EXTENT_LAST)
				return;
		}
	}
}

static int walk_file(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	void *addr;
	int fd;

	(void)ftw;
	if (type != FTW_F || !S_ISREG(st->st_mode) || st->st_size <= 0 || st->st_dev != walk_dev)
		return 0;
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOATIME);
	if (fd < 0)
		fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return 0; /* gone, or not ours to read */
	addr = mmap(NULL, st->st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (addr != MAP_FAILED) {
		mark_file(fd, addr, st->st_size);
		munmap(addr, st->st_size);
	}
	close(fd);
	return 0;
}

/* mountinfo's octal escapes (\040 for a space) undone in place. */
static void unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*w++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*w++ = *s;
		}
	}
	*w = '\0';
}

/* Where the file system on device fs starts on the disk disk, in pages:
 * 0 for the disk itself, a partition's start, or -1 if fs is not on it. */
static long long offset_on_disk(dev_t fs, dev_t disk)
{
	char path[96], buf[64];
	unsigned maj, min;

	if (fs == disk)
		return 0;
	snprintf(path, sizeof path, "/sys/dev/block/%u:%u/../dev", major(fs), minor(fs));
	if (read_small(path, buf, sizeof buf) <= 0 || sscanf(buf, "%u:%u", &maj, &min) != 2 ||
	    makedev(maj, min) != disk)
		return -1;
	snprintf(path, sizeof path, "/sys/dev/block/%u:%u/start", major(fs), minor(fs));
	if (read_small(path, buf, sizeof buf) <= 0)
		return -1;
	return strtoll(buf, NULL, 10) * 512 / (long long)PAGE;
}

/* Walks every file system mounted from the disk (once per device). */
static void mark_mounted(dev_t disk)
{
	enum { MAX_FS = 64 };
	dev_t seen[MAX_FS];
	int nseen = 0;
	char *line = NULL;
	size_t cap = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return;
	while (getline(&line, &cap, f) > 0) {
		unsigned maj, min;
		char mnt[PATH_MAX];
		long long start;
		dev_t dev;
		int dup = 0;

		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT ... */
		if (strlen(line) >= sizeof mnt ||
		    sscanf(line, "%*d %*d %u:%u %*s %s", &maj, &min, mnt) != 3)
			continue;
		dev = makedev(maj, min);
		for (int i = 0; i < nseen; i++)
			dup |= seen[i] == dev;
		if (dup || nseen == MAX_FS)
			continue;
		start = offset_on_disk(dev, disk);
		if (start < 0)
			continue;
		seen[nseen++] = dev;
		unescape(mnt);
		walk_dev = dev;
		walk_start_page = (uint64_t)start;
		nftw(mnt, walk_file, 16, FTW_PHYS | FTW_MOUNT);
	}
	free(line);
	fclose(f);
}

static void put_device(const char *path, int first)
{
	struct stat st;
	uint64_t size = 0, run_start = 0, resident = 0;
	int fd, first_run = 1, in_run = 0;
	void *addr;

	put(first ? "{\"path\":" : ",{\"path\":");
	put_string(path);
	if (strncmp(path, "/dev/", 5) || stat(path, &st) || !S_ISBLK(st.st_mode)) {
		put(",\"error\":\"not a block device\"}");
		return;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || ioctl(fd, BLKGETSIZE64, &size) || size == 0 || size > MAX_DISK_BYTES) {
		putf(",\"error\":\"%s\"}", fd < 0 ? "cannot open it" : "cannot size it (or over 1 TiB)");
		if (fd >= 0)
			close(fd);
		return;
	}
	disk_pages = (size + PAGE - 1) / PAGE;
	bitmap = calloc((disk_pages + 7) / 8, 1);
	if (!bitmap) {
		put(",\"error\":\"out of memory\"}");
		close(fd);
		return;
	}
	/* (a) the block device's own page cache. */
	addr = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (addr != MAP_FAILED) {
		mark_resident(addr, 0, size / PAGE, 0);
		munmap(addr, size);
	}
	close(fd);
	/* (b) the files of its file systems. */
	mark_mounted(st.st_rdev);
	putf(",\"size\":%" PRIu64 ",\"page_bytes\":%llu", size, PAGE);
	for (uint64_t p = 0; p <= disk_pages; p++) {
		int set = p < disk_pages && (bitmap[p / 8] >> (p % 8) & 1);

		if (set) {
			resident++;
			if (!in_run)
				run_start = p, in_run = 1;
		} else if (in_run) {
			if (first_run)
				put(",\"resident\":[");
			putf("%s[%" PRIu64 ",%" PRIu64 "]", first_run ? "" : ",", run_start,
			     p - run_start);
			first_run = 0;
			in_run = 0;
		}
	}
	put(first_run ? ",\"resident\":[]" : "]");
	putf(",\"resident_pages\":%" PRIu64 "}", resident);
	free(bitmap);
	bitmap = NULL;
}

/* ---- a request ---- */

static void answer(char *line)
{
	char *words[MAX_WORDS], *comms[MAX_WORDS], *devs[MAX_WORDS];
	int pids[MAX_WORDS];
	int nwords = 0, npids = 0, ncomms = 0, ndevs = 0;
	char *save, *w;

	out_len = 0;
	out_full = 0;
	for (w = strtok_r(line, " \t\r", &save); w; w = strtok_r(NULL, " \t\r", &save)) {
		if (nwords == MAX_WORDS) {
			answer_error("more than %d words", MAX_WORDS);
			return;
		}
		words[nwords++] = w;
	}
	if (nwords == 0 || strcmp(words[0], "report")) {
		answer_error("unknown request '%.64s' (report [pid=P]... [comm=NAME]... [dev=/dev/vdX]...)",
			     nwords ? words[0] : "");
		return;
	}
	for (int i = 1; i < nwords; i++) {
		char *end;

		if (strncmp(words[i], "pid=", 4) == 0) {
			long pid;

			errno = 0;
			pid = strtol(words[i] + 4, &end, 10);
			if (errno || end == words[i] + 4 || *end || pid <= 0 || pid > INT_MAX) {
				answer_error("bad pid '%.64s'", words[i] + 4);
				return;
			}
			pids[npids++] = (int)pid;
		} else if (strncmp(words[i], "comm=", 5) == 0 && words[i][5] &&
			   strlen(words[i] + 5) < 16) {
			comms[ncomms++] = words[i] + 5;
		} else if (strncmp(words[i], "dev=", 4) == 0 && words[i][4]) {
			devs[ndevs++] = words[i] + 4;
		} else {
			answer_error("unknown word '%.64s' (report [pid=P]... [comm=NAME]... [dev=/dev/vdX]...)",
				     words[i]);
			return;
		}
	}
	putf("{\"agent\":\"%s\",", AGENT_NAME);
	put_meminfo();
	put(",\"processes\":[");
	nlisted = 0;
	first_process = 1;
	for (int i = 0; i < npids; i++)
		put_process(pids[i], 1);
	put_processes_named(comms, ncomms);
	put("],\"devices\":[");
	for (int i = 0; i < ndevs; i++)
		put_device(devs[i], i == 0);
	put("]}\n");
	if (out_full)
		answer_error("the answer is over %u bytes", MAX_ANSWER);
}

/* Reads one line (without its newline) into buf; -1 on a timeout, an
 * error, a line too long or no line at all. */
static int read_line(int conn, char *buf, size_t size)
{
	size_t len = 0;

	while (len < size - 1) {
		ssize_t n = read(conn, buf + len, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return len > 0 ? (buf[len] = '\0', 0) : -1;
		if (buf[len] == '\n') {
			buf[len] = '\0';
			return 0;
		}
		len++;
	}
	return -2;
}

static void serve(int conn, int reply)
{
	static char line[MAX_LINE];
	struct timeval timeout = { .tv_sec = 5 };
	size_t done = 0;
	int r;

	setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
	setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
	r = read_line(conn, line, sizeof line);
	if (r == -2)
		answer_error("the request is over %d bytes", MAX_LINE - 1);
	else if (r < 0)
		return;
	else
		answer(line);
	while (done < out_len) {
		ssize_t n = write(reply, out + done, out_len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		done += n;
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_vm addr = {
		.svm_family = AF_VSOCK,
		.svm_cid = VMADDR_CID_ANY,
		.svm_port = AGENT_PORT,
	};
	int sock = -1, said = 0, answering = 0;

	if (argc == 2 && strcmp(argv[1], "--stdio") == 0) {
		serve(0, 1);
		return 0;
	}
	if (argc != 1)
		bad_flag("usage: hk-ioagent [--stdio] (it listens on vsock port %d)", AGENT_PORT);
	/* The vsock driver may come after this service: retry until it is
	 * there, saying why once. */
	for (;;) {
		sock = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (sock >= 0 && bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0 &&
		    listen(sock, 8) == 0)
			break;
		if (!said)
			fprintf(stderr, PROG ": vsock port %d: %s (retrying every second)\n",
				AGENT_PORT, strerror(errno));
		said = 1;
		if (sock >= 0)
			close(sock);
		sleep(1);
	}
	fprintf(stderr, PROG ": listening on vsock port %d\n", AGENT_PORT);
	for (;;) {
		int conn = accept4(sock, NULL, NULL, SOCK_CLOEXEC);

		if (conn < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			sleep(1);
			continue;
		}
		/* Each answer in a process of its own: a residency walk over a
		 * large file system in a busy guest took longer than the host
		 * waits, and the next request, queued behind it, timed out too
		 * (bench-iocache). At most MAX_ANSWERING at once, so a host that
		 * gives up on slow walks cannot pile them up. */
		while (answering > 0 && waitpid(-1, NULL, WNOHANG) > 0)
			answering--;
		while (answering >= MAX_ANSWERING && waitpid(-1, NULL, 0) > 0)
			answering--;
		pid_t child = fork();
		if (child == 0) {
			close(sock);
			serve(conn, conn);
			_exit(0);
		}
		if (child > 0) {
			answering++;
		} else {
			serve(conn, conn); /* no process to spare: answer here */
			if (out_cap > (1u << 20)) { /* give a big answer's memory back */
				free(out);
				out = NULL;
				out_cap = 0;
			}
			out_len = 0;
		}
		close(conn);
	}
}

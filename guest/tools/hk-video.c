/*
 * hk-video: the virtual-display paper's "video" workload (seed 000): a
 * region of the guest's framebuffer (/dev/fb0) is rewritten at a fixed frame
 * rate, every frame changing every pixel of the region.
 *
 *   hk-video [-x X] [-y Y] [-w W] [-H H] [-f FPS] [-t SECONDS] [-n FRAMES]
 *            [-l linear|tiled|auto] [-C] [-F FILE [-W WIDTH] [-G HEIGHT]]
 *
 * The region is W x H pixels (default 480x400) with its top-left corner at
 * X,Y (default 272,184: centred on a 1024x768 screen); it must fit on the
 * screen. Frame f (0, 1, 2, ...) paints pixel (i,j) of the region (relative
 * to its corner) with the moving gradient
 *   red = (i + 4f) mod 256, green = (j + 2f) mod 256, blue = (i + j) / 4 mod 256
 * so consecutive frames differ in every pixel. Frames are due at
 * start + f/FPS (-f, default 30; 0 = as fast as possible) and paced with
 * clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME); a frame that is late is
 * drawn at once, and the schedule restarts from it (no burst to catch up).
 * The run lasts -t SECONDS (default 10; 0 = no limit) and/or -n FRAMES,
 * whichever ends first; after the last frame the tool waits out its frame
 * period (within -t). Then it prints
 *   hk-video: frames=N seconds=S fps=F layout=L
 * (S with 3 decimals, F = N/S with 2; CLOCK_MONOTONIC).
 *
 * Layout (-l, default auto): linear puts pixel (x,y) at y*line_length + x*4;
 * tiled (hakoniwa's "page-tiled framebuffer") cuts the screen into 32x32
 * tiles of exactly one 4 KiB page, tiles in raster order, pixels row-major
 * inside a tile. auto takes the word hk.fb=linear|tiled from /proc/cmdline
 * (absent: linear).
 *
 * Unless -C is given, /dev/tty0 (if present) is switched to KD_GRAPHICS so
 * that the kernel's framebuffer console no longer draws on the screen; the
 * mode stays after the tool exits.
 *
 * Testing aid: -F FILE draws into the regular file FILE instead of /dev/fb0,
 * as a screen of WIDTH x HEIGHT (default 1024x768) 32-bpp XRGB pixels with
 * line_length WIDTH*4 (or tiled); the file is created or grown as needed.
 *
 * Errors print one line on stderr and exit 1; bad flags exit 2.
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fb.h>
#include <linux/kd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROG "hk-video"
#define TILE 32
#define TILE_BYTES 4096

/* ---- errors ---- */

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	printf(
		"usage: " PROG " [-x X] [-y Y] [-w W] [-H H] [-f FPS] [-t SECONDS] [-n FRAMES]\n"
		"       [-l linear|tiled|auto] [-C] [-F FILE [-W WIDTH] [-G HEIGHT]]\n");
	exit(0);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void bad_flag(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void bad_flag(const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static long long int_arg(const char *s, const char *flag, long long min, long long max)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || end == s || *end != '\0' || v < min || v > max)
		bad_flag("bad %s value '%s' (an integer from %lld to %lld)", flag, s, min, max);
	return v;
}

static double num_arg(const char *s, const char *flag)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !(v >= 0) || v > 1e9)
		bad_flag("bad %s value '%s' (a number >= 0)", flag, s);
	return v;
}

/* ---- the framebuffer ---- */

struct fb {
	uint8_t *mem;
	size_t map_len;
	unsigned width, height;
	unsigned stride;	/* bytes per line (linear layout) */
	unsigned tiles_x;
	int tiled;
	unsigned roff, goff, boff;
};

/* The layout word of /proc/cmdline: hk.fb=linear|tiled (last one wins). */
static int cmdline_layout(void)
{
	char buf[4096], *save, *w;
	int tiled = 0;
	FILE *f = fopen("/proc/cmdline", "r");

	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	for (w = strtok_r(buf, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
		if (strncmp(w, "hk.fb=", 6) != 0)
			continue;
		if (strcmp(w + 6, "linear") == 0)
			tiled = 0;
		else if (strcmp(w + 6, "tiled") == 0)
			tiled = 1;
		else
			fail("unknown layout '%s' in /proc/cmdline (hk.fb=linear or hk.fb=tiled)", w);
	}
	return tiled;
}

static void fb_open(struct fb *fb, const char *layout, const char *file,
		    unsigned file_w, unsigned file_h)
{
	size_t need, avail;
	int fd;

	if (strcmp(layout, "linear") == 0)
		fb->tiled = 0;
	else if (strcmp(layout, "tiled") == 0)
		fb->tiled = 1;
	else if (strcmp(layout, "auto") == 0)
		fb->tiled = cmdline_layout();
	else
		bad_flag("bad -l value '%s' (linear, tiled or auto)", layout);

	if (file) {
		struct stat st;

		fd = open(file, O_RDWR | O_CREAT, 0644);
		if (fd < 0)
			fail("%s: %s", file, strerror(errno));
		fb->width = file_w;
		fb->height = file_h;
		fb->stride = file_w * 4;
		fb->roff = 16, fb->goff = 8, fb->boff = 0;
		avail = (size_t)file_w * file_h * 4;
		if (fstat(fd, &st) < 0)
			fail("%s: %s", file, strerror(errno));
		if ((size_t)st.st_size < avail && ftruncate(fd, avail) < 0)
			fail("%s: %s", file, strerror(errno));
	} else {
		struct fb_var_screeninfo var;
		struct fb_fix_screeninfo fix;

		fd = open("/dev/fb0", O_RDWR);
		if (fd < 0)
			fail("/dev/fb0: %s", strerror(errno));
		if (ioctl(fd, FBIOGET_VSCREENINFO, &var) < 0 ||
		    ioctl(fd, FBIOGET_FSCREENINFO, &fix) < 0)
			fail("/dev/fb0: cannot get screen info: %s", strerror(errno));
		if (var.bits_per_pixel != 32)
			fail("/dev/fb0: %u bits per pixel, need 32", var.bits_per_pixel);
		fb->width = var.xres;
		fb->height = var.yres;
		fb->stride = fix.line_length;
		fb->roff = var.red.offset, fb->goff = var.green.offset, fb->boff = var.blue.offset;
		avail = fix.smem_len;
	}
	if (fb->width == 0 || fb->height == 0)
		fail("empty screen (%ux%u)", fb->width, fb->height);
	if (fb->tiled) {
		if (fb->width % TILE || fb->height % TILE)
			fail("tiled layout needs a screen size in multiples of 32, not %ux%u",
			     fb->width, fb->height);
		fb->tiles_x = fb->width / TILE;
		need = (size_t)fb->tiles_x * (fb->height / TILE) * TILE_BYTES;
	} else {
		if (fb->stride < fb->width * 4)
			fail("line length %u is less than %u pixels", fb->stride, fb->width);
		need = (size_t)fb->stride * fb->height;
	}
	if (need > avail)
		fail("the framebuffer holds %zu bytes, the %ux%u screen needs %zu",
		     avail, fb->width, fb->height, need);
	fb->map_len = need;
	fb->mem = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fb->mem == MAP_FAILED)
		fail("mmap %s: %s", file ? file : "/dev/fb0", strerror(errno));
	close(fd);
}

/* The kernel's framebuffer console stops drawing in KD_GRAPHICS mode. */
static void console_graphics(void)
{
	int fd = open("/dev/tty0", O_RDWR | O_NOCTTY);

	if (fd < 0)
		return;
	ioctl(fd, KDSETMODE, KD_GRAPHICS);
	close(fd);
}

static inline uint32_t pixel(const struct fb *fb, uint32_t rgb)
{
	return ((rgb >> 16 & 0xff) << fb->roff) | ((rgb >> 8 & 0xff) << fb->goff) |
	       ((rgb & 0xff) << fb->boff);
}

static inline size_t px_off(const struct fb *fb, unsigned x, unsigned y)
{
	if (fb->tiled)
		return ((size_t)(y / TILE) * fb->tiles_x + x / TILE) * TILE_BYTES +
		       ((y % TILE) * TILE + x % TILE) * 4;
	return (size_t)y * fb->stride + (size_t)x * 4;
}

/* Pixels x .. x+w-1 of row y are contiguous in memory up to the next tile
 * boundary (tiled) or all of them (linear). */
static inline unsigned run_len(const struct fb *fb, unsigned x, unsigned w)
{
	unsigned n = fb->tiled ? TILE - x % TILE : w;

	return n < w ? n : w;
}

/* ---- time ---- */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
	struct timespec ts;

	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L)
		ts.tv_sec++, ts.tv_nsec -= 1000000000L;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* ---- the frames ---- */

/* Frame f of the region x,y,w,h: each row is written run by run (a run is
 * contiguous: the whole row in linear layout, up to a tile edge in tiled). */
static void draw_frame(const struct fb *fb, unsigned x, unsigned y, unsigned w, unsigned h,
		       unsigned long f)
{
	unsigned r0 = (unsigned)(4 * f), g0 = (unsigned)(2 * f);

	for (unsigned j = 0; j < h; j++) {
		unsigned g = (j + g0) & 0xff, i = 0;

		while (i < w) {
			unsigned n = run_len(fb, x + i, w - i);
			uint32_t *p = (uint32_t *)(fb->mem + px_off(fb, x + i, y + j));

			for (unsigned k = 0; k < n; k++, i++)
				p[k] = pixel(fb, ((i + r0) & 0xff) << 16 | g << 8 | ((i + j) >> 2 & 0xff));
		}
	}
}

int main(int argc, char **argv)
{
	const char *layout = "auto", *file = NULL;
	long long x = 272, y = 184, w = 480, h = 400, count = 0;
	long long file_w = 1024, file_h = 768;
	double fps = 30, seconds = 10, start, end, next, stop, base;
	int opt, keep_console = 0;
	unsigned long frames = 0, base_frame = 0;
	struct fb fb = { 0 };

	while ((opt = getopt(argc, argv, ":x:y:w:H:f:t:n:l:CF:W:G:h")) != -1) {
		switch (opt) {
		case 'x': x = int_arg(optarg, "-x", 0, 1 << 20); break;
		case 'y': y = int_arg(optarg, "-y", 0, 1 << 20); break;
		case 'w': w = int_arg(optarg, "-w", 1, 1 << 20); break;
		case 'H': h = int_arg(optarg, "-H", 1, 1 << 20); break;
		case 'f': fps = num_arg(optarg, "-f"); break;
		case 't': seconds = num_arg(optarg, "-t"); break;
		case 'n': count = int_arg(optarg, "-n", 1, 1LL << 50); break;
		case 'l': layout = optarg; break;
		case 'C': keep_console = 1; break;
		case 'F': file = optarg; break;
		case 'W': file_w = int_arg(optarg, "-W", 1, 1 << 15); break;
		case 'G': file_h = int_arg(optarg, "-G", 1, 1 << 15); break;
		case 'h': usage();
		case ':': bad_flag("-%c needs a value", optopt);
		default: bad_flag("unknown flag -%c (-h for usage)", optopt);
		}
	}
	if (optind != argc)
		bad_flag("unexpected argument '%s' (-h for usage)", argv[optind]);

	fb_open(&fb, layout, file, file_w, file_h);
	if (x + w > fb.width || y + h > fb.height)
		fail("the region %lldx%lld at %lld,%lld does not fit the %ux%u screen", w, h, x, y,
		     fb.width, fb.height);
	if (!file && !keep_console)
		console_graphics();

	start = now();
	stop = seconds > 0 ? start + seconds : 0;
	base = start; /* frame `frames` is due at base + (frames - base_frame) / fps */
	next = start;
	for (;;) {
		if (count && frames >= (unsigned long long)count)
			break;
		if (stop && next >= stop - 1e-6)
			break;
		if (fps > 0)
			sleep_until(next);
		draw_frame(&fb, x, y, w, h, frames);
		frames++;
		if (fps > 0) {
			double t = now();

			next = base + (frames - base_frame) / fps;
			if (next < t) {
				/* Late: go on from here, no burst to catch up. */
				base = next = t;
				base_frame = frames;
			}
		} else {
			next = now();
		}
	}
	/* The last frame stays up for its period. */
	if (fps > 0)
		sleep_until(stop && next > stop ? stop : next);
	end = now();
	if (file && msync(fb.mem, fb.map_len, MS_SYNC) < 0)
		fail("msync %s: %s", file, strerror(errno));
	printf(PROG ": frames=%lu seconds=%.3f fps=%.2f layout=%s\n", frames, end - start,
	       end > start ? frames / (end - start) : 0.0, fb.tiled ? "tiled" : "linear");
	return 0;
}

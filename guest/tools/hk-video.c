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
#define PROG "hk-video"
#include "hk-fb.h"

/* ---- usage ---- */

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	printf(
		"usage: " PROG " [-x X] [-y Y] [-w W] [-H H] [-f FPS] [-t SECONDS] [-n FRAMES]\n"
		"       [-l linear|tiled|auto] [-C] [-F FILE [-W WIDTH] [-G HEIGHT]]\n");
	exit(0);
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
	long long x = 272, y = 184, w = 480, h = 400, count = 0;
	double fps = 30, seconds = 10, start, end, next, stop, base;
	int opt;
	unsigned long frames = 0, base_frame = 0;
	struct fb_flags ff = FB_FLAGS_INIT;
	struct fb fb = { 0 };

	while ((opt = getopt(argc, argv, ":x:y:w:H:f:t:n:" FB_OPTSTRING "h")) != -1) {
		if (fb_flag(&ff, opt))
			continue;
		switch (opt) {
		case 'x': x = int_arg(optarg, "-x", 0, 1 << 20); break;
		case 'y': y = int_arg(optarg, "-y", 0, 1 << 20); break;
		case 'w': w = int_arg(optarg, "-w", 1, 1 << 20); break;
		case 'H': h = int_arg(optarg, "-H", 1, 1 << 20); break;
		case 'f': fps = num_arg(optarg, "-f"); break;
		case 't': seconds = num_arg(optarg, "-t"); break;
		case 'n': count = int_arg(optarg, "-n", 1, 1LL << 50); break;
		case 'h': usage();
		case ':': bad_flag("-%c needs a value", optopt);
		default: bad_flag("unknown flag -%c (-h for usage)", optopt);
		}
	}
	if (optind != argc)
		bad_flag("unexpected argument '%s' (-h for usage)", argv[optind]);

	fb_open(&fb, &ff);
	if (x + w > fb.width || y + h > fb.height)
		fail("the region %lldx%lld at %lld,%lld does not fit the %ux%u screen", w, h, x, y,
		     fb.width, fb.height);
	console_graphics(&ff);

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
	fb_sync(&fb, ff.file);
	printf(PROG ": frames=%lu seconds=%.3f fps=%.2f layout=%s\n", frames, end - start,
	       end > start ? frames / (end - start) : 0.0, fb.tiled ? "tiled" : "linear");
	return 0;
}

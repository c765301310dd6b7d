/*
 * hk-fbdraw: a drawing benchmark for the guest's framebuffer (/dev/fb0), a
 * clone of the "hdbench" patterns the virtual-display paper measures (seed
 * 000: rectangles, circles, text and scrolling on a 640x480 canvas), plus
 * deterministic one-shot drawings for tests.
 *
 *   hk-fbdraw [-p PATTERN] [-x X] [-y Y] [-w W] [-H H] [-t SECONDS]
 *             [-n COUNT] [-r RATE] [-s SEED] [-c 0xRRGGBB] [-k ROWS]
 *             [-l linear|tiled|auto] [-C] [-F FILE [-W WIDTH] [-G HEIGHT]]
 *
 * Patterns (-p, default rect), drawn on the canvas: W x H pixels (default
 * 640x480) with its top-left corner at X,Y (default 100,100, deliberately
 * not on a 32-pixel tile boundary). The canvas must fit on the screen.
 *   rect    one op = a 50x50 filled rectangle, random position and colour
 *   circle  one op = a filled circle of diameter 50, random position/colour
 *   text    one op = a string of 16 characters (8x8 cells, own 5x7 font,
 *           random fg colour on black) written at a console-like cursor
 *           that wraps at the canvas's right edge and bottom
 *   scroll  one op = the canvas content moves up by ROWS rows (-k, default
 *           8; one memmove per row and tile), and a new stripe of ROWS rows
 *           in a random colour is drawn at the bottom
 *   fill    fill exactly the rectangle X,Y,W,H with -c (default 0xFFFFFF),
 *           then exit (ops=1)
 *   scene   a deterministic picture from the seed: a background, 24 rects,
 *           12 circles and 4 strings; the same seed gives the same pixels
 *           in either layout (ops=41)
 *   clear   the whole screen in -c (default 0x000000), then exit (ops=1)
 * The benchmark patterns run for -t SECONDS and/or -n COUNT ops, whichever
 * ends first (default: -t 5; -t 0 is no time limit); -r RATE paces them to
 * RATE ops per second (default: as fast as possible). Random numbers come
 * from -s SEED (default 1, splitmix64), so a run is deterministic. At the end it prints
 *   hk-fbdraw: pattern=P layout=L ops=N seconds=S ops_per_s=R
 * (S with 3 decimals, R with 1; CLOCK_MONOTONIC).
 *
 * Layout (-l, default auto): linear puts pixel (x,y) at y*line_length + x*4;
 * tiled (hakoniwa's "page-tiled framebuffer") cuts the screen into 32x32
 * tiles of exactly one 4 KiB page, tiles in raster order, pixels row-major
 * inside a tile. auto takes the word hk.fb=linear|tiled from /proc/cmdline
 * (absent: linear).
 *
 * Unless -C is given, /dev/tty0 (if present) is switched to KD_GRAPHICS so
 * that the kernel's framebuffer console (its blinking cursor, messages) no
 * longer draws on the screen; the mode stays after the tool exits.
 *
 * Testing aid: -F FILE draws into the regular file FILE instead of /dev/fb0,
 * as a screen of WIDTH x HEIGHT (default 1024x768) 32-bpp XRGB pixels with
 * line_length WIDTH*4 (or tiled). The file is created or grown as needed;
 * its content is kept, so several runs draw on the same picture.
 *
 * Errors print one line on stderr and exit 1; bad flags exit 2.
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#define _GNU_SOURCE
#define PROG "hk-fbdraw"
#include "hk-fb.h"

#define SHAPE 50	/* rect side and circle diameter of the benchmark */
#define TEXT_LEN 16	/* characters per text op */
#define CELL 8		/* text cell: 8x8 pixels */

/* ---- usage ---- */

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	printf(
		"usage: " PROG " [-p rect|circle|text|scroll|fill|scene|clear] [-x X] [-y Y]\n"
		"       [-w W] [-H H] [-t SECONDS] [-n COUNT] [-r RATE] [-s SEED] [-c 0xRRGGBB]\n"
		"       [-k ROWS] [-l linear|tiled|auto] [-C] [-F FILE [-W WIDTH] [-G HEIGHT]]\n");
	exit(0);
}

/* ---- drawing (the framebuffer itself: hk-fb.h) ---- */

static inline void put_pixel(const struct fb *fb, unsigned x, unsigned y, uint32_t px)
{
	*(uint32_t *)(fb->mem + px_off(fb, x, y)) = px;
}

static void fill_span(const struct fb *fb, unsigned x, unsigned y, unsigned w, uint32_t px)
{
	while (w) {
		unsigned n = run_len(fb, x, w);
		uint32_t *p = (uint32_t *)(fb->mem + px_off(fb, x, y));

		for (unsigned i = 0; i < n; i++)
			p[i] = px;
		x += n;
		w -= n;
	}
}

/* Callers keep the rectangle on the screen. */
static void fill_rect(const struct fb *fb, unsigned x, unsigned y, unsigned w, unsigned h,
		      uint32_t px)
{
	for (unsigned j = 0; j < h; j++)
		fill_span(fb, x, y + j, w, px);
}

/* Copies pixels x .. x+w-1 of row ys to row yd (memmove per contiguous run;
 * both rows split at the same x, so the runs line up in either layout). */
static void copy_row(const struct fb *fb, unsigned x, unsigned w, unsigned ys, unsigned yd)
{
	while (w) {
		unsigned n = run_len(fb, x, w);

		memmove(fb->mem + px_off(fb, x, yd), fb->mem + px_off(fb, x, ys), n * 4);
		x += n;
		w -= n;
	}
}

/* A filled circle of diameter d with its bounding box at x,y: pixel (i,j) is
 * in when its centre is within d/2 of the box's centre. */
static void fill_circle(const struct fb *fb, unsigned x, unsigned y, unsigned d, uint32_t px)
{
	long long r2 = (long long)d * d; /* in half-pixel units: (2 * d/2)^2 */

	for (unsigned j = 0; j < d; j++) {
		long long dy = 2LL * j + 1 - d;
		unsigned i = 0;

		while (i < d / 2 && (2LL * i + 1 - d) * (2LL * i + 1 - d) + dy * dy > r2)
			i++;
		if (d - 2 * i > 0 && (2LL * i + 1 - d) * (2LL * i + 1 - d) + dy * dy <= r2)
			fill_span(fb, x + i, y + j, d - 2 * i, px);
	}
}

/* ---- the font: 5x7 glyphs (bit 4 = leftmost column), drawn in 8x8 cells
 * at column 1, row 0; rows 7 and columns 0, 6, 7 are background. ---- */

/* Glyphs, in order: space 0-9 A-Z - . : = / */
static const uint8_t font[][7] = {
	{0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* space */
	{0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, /* 0 */
	{0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* 1 */
	{0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, /* 2 */
	{0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}, /* 3 */
	{0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, /* 4 */
	{0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}, /* 5 */
	{0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, /* 6 */
	{0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}, /* 7 */
	{0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, /* 8 */
	{0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}, /* 9 */
	{0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}, /* A */
	{0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}, /* B */
	{0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}, /* C */
	{0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}, /* D */
	{0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}, /* E */
	{0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}, /* F */
	{0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}, /* G */
	{0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}, /* H */
	{0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* I */
	{0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}, /* J */
	{0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}, /* K */
	{0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}, /* L */
	{0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}, /* M */
	{0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}, /* N */
	{0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, /* O */
	{0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}, /* P */
	{0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}, /* Q */
	{0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}, /* R */
	{0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}, /* S */
	{0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}, /* T */
	{0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, /* U */
	{0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}, /* V */
	{0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}, /* W */
	{0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}, /* X */
	{0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}, /* Y */
	{0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}, /* Z */
	{0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}, /* - */
	{0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}, /* . */
	{0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}, /* : */
	{0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}, /* = */
	{0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}, /* / */
};
#define FONT_N ((int)sizeof(font) / (int)sizeof(font[0]))

/* One 8x8 cell, glyph index g (into font), every pixel written. */
static void draw_char(const struct fb *fb, unsigned x, unsigned y, int g, uint32_t fg,
		      uint32_t bg)
{
	for (unsigned j = 0; j < CELL; j++) {
		unsigned bits = j < 7 ? (unsigned)font[g][j] << 2 : 0; /* bit 6 = column 1 */

		for (unsigned i = 0; i < CELL; i++)
			put_pixel(fb, x + i, y + j, bits >> (7 - i) & 1 ? fg : bg);
	}
}

/* ---- random numbers: splitmix64 ---- */

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/* Uniform-enough in [0, n) for small n. */
static unsigned rnd(unsigned n)
{
	return n ? (unsigned)(rng() % n) : 0;
}

static uint32_t rnd_rgb(void)
{
	return (uint32_t)(rng() >> 40); /* 24 bits */
}

/* ---- patterns ---- */

struct canvas {
	const struct fb *fb;
	unsigned x, y, w, h;
	unsigned cur_x, cur_y;	/* text cursor, relative to the canvas */
	unsigned step;		/* scroll rows per op */
};

static void op_rect(struct canvas *c)
{
	unsigned x = rnd(c->w - SHAPE + 1), y = rnd(c->h - SHAPE + 1);

	fill_rect(c->fb, c->x + x, c->y + y, SHAPE, SHAPE, pixel(c->fb, rnd_rgb()));
}

static void op_circle(struct canvas *c)
{
	unsigned x = rnd(c->w - SHAPE + 1), y = rnd(c->h - SHAPE + 1);

	fill_circle(c->fb, c->x + x, c->y + y, SHAPE, pixel(c->fb, rnd_rgb()));
}

static void op_text(struct canvas *c)
{
	uint32_t fg = pixel(c->fb, rnd_rgb() | 0x404040), bg = pixel(c->fb, 0);

	for (int k = 0; k < TEXT_LEN; k++) {
		if (c->cur_x + CELL > c->w) {
			c->cur_x = 0;
			c->cur_y += CELL;
		}
		if (c->cur_y + CELL > c->h)
			c->cur_y = 0;
		draw_char(c->fb, c->x + c->cur_x, c->y + c->cur_y, 1 + rnd(36), fg, bg);
		c->cur_x += CELL;
	}
}

static void op_scroll(struct canvas *c)
{
	unsigned k = c->step;

	for (unsigned j = 0; j + k < c->h; j++)
		copy_row(c->fb, c->x, c->w, c->y + j + k, c->y + j);
	fill_rect(c->fb, c->x, c->y + c->h - k, c->w, k, pixel(c->fb, rnd_rgb()));
}

/* A string of n characters from the font at canvas position x,y (clipped to
 * whole cells inside the canvas). */
static void draw_string(struct canvas *c, unsigned x, unsigned y, const int *glyphs, int n,
			uint32_t fg, uint32_t bg)
{
	for (int k = 0; k < n && x + CELL <= c->w && y + CELL <= c->h; k++, x += CELL)
		draw_char(c->fb, c->x + x, c->y + y, glyphs[k], fg, bg);
}

/* The deterministic picture: every draw decision comes from the seed. */
static unsigned long scene(struct canvas *c)
{
	const struct fb *fb = c->fb;
	unsigned long ops = 0;

	fill_rect(fb, c->x, c->y, c->w, c->h, pixel(fb, rnd_rgb() & 0x3f3f3f));
	ops++;
	for (int k = 0; k < 24; k++, ops++) {
		unsigned w = 1 + rnd(c->w < 160 ? c->w : 160), h = 1 + rnd(c->h < 120 ? c->h : 120);
		unsigned x = rnd(c->w - w + 1), y = rnd(c->h - h + 1);

		fill_rect(fb, c->x + x, c->y + y, w, h, pixel(fb, rnd_rgb()));
	}
	for (int k = 0; k < 12; k++, ops++) {
		unsigned max = c->w < c->h ? c->w : c->h, d;

		d = 1 + rnd(max < 100 ? max : 100);
		fill_circle(fb, c->x + rnd(c->w - d + 1), c->y + rnd(c->h - d + 1), d,
			    pixel(fb, rnd_rgb()));
	}
	for (int k = 0; k < 4; k++, ops++) {
		int glyphs[24], n = 4 + rnd(20);
		unsigned x = rnd(c->w >= CELL ? c->w - CELL + 1 : 1);
		unsigned y = rnd(c->h >= CELL ? c->h - CELL + 1 : 1);
		uint32_t fg = rnd_rgb(), bg = rnd_rgb();

		for (int i = 0; i < n; i++)
			glyphs[i] = rnd(FONT_N);
		draw_string(c, x, y, glyphs, n, pixel(fb, fg), pixel(fb, bg));
	}
	return ops;
}

int main(int argc, char **argv)
{
	const char *pattern = "rect";
	long long x = 100, y = 100, w = 640, h = 480, count = 0, seed = 1, color = -1;
	long long step = 8;
	double seconds = -1, rate = 0;
	int opt;
	struct fb_flags ff = FB_FLAGS_INIT;
	struct fb fb = { 0 };
	struct canvas c;
	void (*op)(struct canvas *) = NULL;
	unsigned long ops = 0;
	double start, end;

	while ((opt = getopt(argc, argv, ":p:x:y:w:H:t:n:r:s:c:k:" FB_OPTSTRING "h")) != -1) {
		if (fb_flag(&ff, opt))
			continue;
		switch (opt) {
		case 'p': pattern = optarg; break;
		case 'x': x = int_arg(optarg, "-x", 0, 1 << 20); break;
		case 'y': y = int_arg(optarg, "-y", 0, 1 << 20); break;
		case 'w': w = int_arg(optarg, "-w", 1, 1 << 20); break;
		case 'H': h = int_arg(optarg, "-H", 1, 1 << 20); break;
		case 't': seconds = num_arg(optarg, "-t"); break;
		case 'n': count = int_arg(optarg, "-n", 1, 1LL << 50); break;
		case 'r': rate = num_arg(optarg, "-r"); break;
		case 's': seed = int_arg(optarg, "-s", 0, 1LL << 62); break;
		case 'c': color = int_arg(optarg, "-c", 0, 0xFFFFFF); break;
		case 'k': step = int_arg(optarg, "-k", 1, 1 << 20); break;
		case 'h': usage();
		case ':': bad_flag("-%c needs a value", optopt);
		default: bad_flag("unknown flag -%c (-h for usage)", optopt);
		}
	}
	if (optind != argc)
		bad_flag("unexpected argument '%s' (-h for usage)", argv[optind]);
	if (strcmp(pattern, "rect") == 0)
		op = op_rect;
	else if (strcmp(pattern, "circle") == 0)
		op = op_circle;
	else if (strcmp(pattern, "text") == 0)
		op = op_text;
	else if (strcmp(pattern, "scroll") == 0)
		op = op_scroll;
	else if (strcmp(pattern, "fill") && strcmp(pattern, "scene") && strcmp(pattern, "clear"))
		bad_flag("unknown pattern '%s' (rect, circle, text, scroll, fill, scene or clear)",
			 pattern);
	if ((op == op_rect || op == op_circle) && (w < SHAPE || h < SHAPE))
		bad_flag("the canvas (%lldx%lld) must be at least %dx%d for -p %s", w, h, SHAPE,
			 SHAPE, pattern);
	if (op == op_text && (w < CELL || h < CELL))
		bad_flag("the canvas (%lldx%lld) must be at least %dx%d for -p text", w, h, CELL,
			 CELL);
	if (op == op_scroll && step >= h)
		bad_flag("-k %lld must be less than the canvas height %lld", step, h);
	if (seconds < 0)
		seconds = count ? 0 : 5;

	fb_open(&fb, &ff);
	if (strcmp(pattern, "clear") != 0 && (x + w > fb.width || y + h > fb.height))
		fail("the %s %lldx%lld at %lld,%lld does not fit the %ux%u screen",
		     strcmp(pattern, "fill") ? "canvas" : "rectangle", w, h, x, y, fb.width,
		     fb.height);
	console_graphics(&ff);

	rng_state = (uint64_t)seed;
	c = (struct canvas){ .fb = &fb, .x = x, .y = y, .w = w, .h = h, .step = step };
	start = now();
	if (strcmp(pattern, "fill") == 0) {
		fill_rect(&fb, x, y, w, h, pixel(&fb, color < 0 ? 0xFFFFFF : color));
		ops = 1;
	} else if (strcmp(pattern, "clear") == 0) {
		fill_rect(&fb, 0, 0, fb.width, fb.height, pixel(&fb, color < 0 ? 0 : color));
		ops = 1;
	} else if (strcmp(pattern, "scene") == 0) {
		ops = scene(&c);
	} else {
		double stop = seconds > 0 ? start + seconds : 0;

		for (;;) {
			if (count && ops >= (unsigned long long)count)
				break;
			if (rate > 0) {
				double next = start + ops / rate;

				if (stop && next >= stop) {
					sleep_until(stop);
					break;
				}
				sleep_until(next);
			}
			if (stop && now() >= stop)
				break;
			op(&c);
			ops++;
		}
	}
	end = now();
	fb_sync(&fb, ff.file);
	printf(PROG ": pattern=%s layout=%s ops=%lu seconds=%.3f ops_per_s=%.1f\n", pattern,
	       fb.tiled ? "tiled" : "linear", ops, end - start,
	       end > start ? ops / (end - start) : 0.0);
	return 0;
}

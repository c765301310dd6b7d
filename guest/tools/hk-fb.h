/*
 * hk-fb.h: the framebuffer part that hk-fbdraw and hk-video share (both
 * include it): opening /dev/fb0 (or, for the -F testing aid, a regular file
 * as a WIDTH x HEIGHT 32-bpp XRGB screen), checking its geometry and mapping
 * it; the layout (-l linear|tiled|auto, auto from hk.fb= in /proc/cmdline);
 * pixel values and offsets in either layout; switching the console to
 * KD_GRAPHICS; msync of the -F file at the end; and the flags for all this
 * (-l, -C, -F, -W, -G: struct fb_flags, fb_flag).
 *
 * Like hk-tool.h, which it includes (for the errors and int_arg), it wants
 * _GNU_SOURCE and PROG defined first; see there.
 */
#ifndef HK_FB_H
#define HK_FB_H

#include <fcntl.h>
#include <linux/fb.h>
#include <linux/kd.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hk-tool.h"

#define TILE 32
#define TILE_BYTES 4096

/* The screen flags both tools take: -l linear|tiled|auto, -C (leave the
 * console alone) and the testing aid -F FILE [-W WIDTH] [-G HEIGHT]. A tool
 * puts FB_OPTSTRING into its getopt string and offers each flag to fb_flag
 * before its own switch. */
#define FB_OPTSTRING "l:CF:W:G:"
#define FB_FLAGS_INIT { .layout = "auto", .file = NULL, .file_w = 1024, .file_h = 768 }

struct fb_flags {
	const char *layout;
	const char *file;	/* -F: a regular file instead of /dev/fb0 */
	long long file_w, file_h;
	int keep_console;
};

/* 1 if opt (its value in optarg) is a screen flag, now taken into ff. */
static int fb_flag(struct fb_flags *ff, int opt)
{
	switch (opt) {
	case 'l': ff->layout = optarg; return 1;
	case 'C': ff->keep_console = 1; return 1;
	case 'F': ff->file = optarg; return 1;
	case 'W': ff->file_w = int_arg(optarg, "-W", 1, 1 << 15); return 1;
	case 'G': ff->file_h = int_arg(optarg, "-G", 1, 1 << 15); return 1;
	}
	return 0;
}

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

static void fb_open(struct fb *fb, const struct fb_flags *ff)
{
	const char *layout = ff->layout, *file = ff->file;
	unsigned file_w = ff->file_w, file_h = ff->file_h;
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

/* The kernel's framebuffer console stops drawing in KD_GRAPHICS mode; not
 * with -C, nor with -F (the screen is not being drawn on). */
static void console_graphics(const struct fb_flags *ff)
{
	int fd;

	if (ff->file || ff->keep_console)
		return;
	fd = open("/dev/tty0", O_RDWR | O_NOCTTY);
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

/* The -F file: its pixels are on disk before the result line is printed. */
static void fb_sync(const struct fb *fb, const char *file)
{
	if (file && msync(fb->mem, fb->map_len, MS_SYNC) < 0)
		fail("msync %s: %s", file, strerror(errno));
}

#endif /* HK_FB_H */

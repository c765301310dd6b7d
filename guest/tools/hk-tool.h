/*
 * hk-tool.h: what the guest tools hk-fbdraw, hk-video, hk-input and
 * hk-ioagent share:
 * the one-line error exits (die, and its shorthands fail: status 1 and
 * bad_flag: status 2), parsing of numeric flag values (int_arg, num_arg) and
 * CLOCK_MONOTONIC time (now, sleep_until). Included by hk-input.c,
 * hk-ioagent.c and hk-fb.h (so by hk-fbdraw.c and hk-video.c).
 *
 * Each tool is one .c file built on its own (gcc -static -Os -s, see
 * scripts/build-guest), so everything here is static; a tool defines
 * _GNU_SOURCE before its first #include and PROG (its name, the prefix of
 * every error line) before including this file. Functions not every tool
 * calls are marked unused so that -Wall -Werror accepts the tools that do
 * without them.
 */
#ifndef HK_TOOL_H
#define HK_TOOL_H

#ifndef PROG
#error "define PROG (the tool's name) before including hk-tool.h"
#endif

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HK_UNUSED __attribute__((unused))

/* ---- errors ---- */

/* One line on stderr, PROG first, then exit with status. */
static void die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int status, const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(status);
}

/* A failure at run time exits 1, a bad command line 2 (macros, so that the
 * format checks of die apply to each call). */
#define fail(...) die(1, __VA_ARGS__)
#define bad_flag(...) die(2, __VA_ARGS__)

/* ---- flag values ---- */

static HK_UNUSED long long int_arg(const char *s, const char *flag, long long min,
				   long long max)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || end == s || *end != '\0' || v < min || v > max)
		bad_flag("bad %s value '%s' (an integer from %lld to %lld)", flag, s, min, max);
	return v;
}

static HK_UNUSED double num_arg(const char *s, const char *flag)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !(v >= 0) || v > 1e9)
		bad_flag("bad %s value '%s' (a number >= 0)", flag, s);
	return v;
}

/* ---- time ---- */

static HK_UNUSED double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static HK_UNUSED void sleep_until(double t)
{
	struct timespec ts;

	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L)
		ts.tv_sec++, ts.tv_nsec -= 1000000000L;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

#endif /* HK_TOOL_H */

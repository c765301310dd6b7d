/*
 * hk-input: prints the guest's input events (virtio-input keyboards, mice,
 * tablets, through the evdev module's /dev/input/event* devices), one per
 * line, for tests of hakoniwa's display input path.
 *
 *   hk-input [-n COUNT] [-t SECONDS] [DEVICE...]
 *
 * It opens every /dev/input/event* device (or the DEVICEs given); if there
 * is none yet it waits up to 2 s for one to appear. When all are open it
 * prints
 *   hk-input: ready
 * (tests send their events after that line), then polls all the devices and
 * prints each event on its own line, flushed at once:
 *   key CODE VALUE    EV_KEY, CODE < 0x100 or >= 0x160 (keys)
 *   btn CODE VALUE    EV_KEY, 0x100 <= CODE < 0x160 (mouse, joystick, touch
 *                     buttons: BTN_LEFT is 272)
 *   abs AXIS VALUE    EV_ABS (ABS_X is 0, ABS_Y is 1)
 *   rel AXIS VALUE    EV_REL (REL_X 0, REL_Y 1, REL_WHEEL 8)
 * CODE, AXIS and VALUE in decimal (VALUE signed; for keys 1 = press,
 * 0 = release, 2 = autorepeat). Other event types (EV_SYN, EV_MSC, EV_LED,
 * ...) are not printed. It stops after COUNT printed events (-n, default
 * no limit) or SECONDS (-t, default 10; 0 = no limit), whichever comes
 * first, and exits 0.
 *
 * No event device (after the 2 s) or one that cannot be opened: one error
 * line on stderr, exit 1. Bad flags exit 2.
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/input.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROG "hk-input"
#include "hk-tool.h"

#define MAX_DEVS 64
#define WAIT_FOR_DEVICES 2.0 /* seconds */

/* /dev/input/eventN names, sorted by N. */
static int event_num(const char *name)
{
	char *end;
	long n;

	if (strncmp(name, "event", 5) != 0 || name[5] < '0' || name[5] > '9')
		return -1;
	n = strtol(name + 5, &end, 10);
	return *end == '\0' && n < 1000000 ? (int)n : -1;
}

static int by_number(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

static int scan_devices(int *nums)
{
	DIR *dir = opendir("/dev/input");
	struct dirent *de;
	int n = 0;

	if (!dir)
		return 0;
	while ((de = readdir(dir)) && n < MAX_DEVS) {
		int num = event_num(de->d_name);

		if (num >= 0)
			nums[n++] = num;
	}
	closedir(dir);
	qsort(nums, n, sizeof(*nums), by_number);
	return n;
}

int main(int argc, char **argv)
{
	struct pollfd fds[MAX_DEVS];
	char path[64];
	int nums[MAX_DEVS];
	int ndev = 0, opt;
	long long count = 0, printed = 0;
	double seconds = 10, deadline;

	while ((opt = getopt(argc, argv, ":n:t:h")) != -1) {
		char *end;

		switch (opt) {
		case 'n':
			errno = 0;
			count = strtoll(optarg, &end, 0);
			if (errno || end == optarg || *end || count < 1)
				bad_flag("bad -n value '%s' (a count >= 1)", optarg);
			break;
		case 't':
			errno = 0;
			seconds = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(seconds >= 0) || seconds > 1e9)
				bad_flag("bad -t value '%s' (seconds >= 0)", optarg);
			break;
		case 'h':
			printf("usage: " PROG " [-n COUNT] [-t SECONDS] [DEVICE...]\n");
			return 0;
		case ':':
			bad_flag("-%c needs a value", optopt);
		default:
			bad_flag("unknown flag -%c (-h for usage)", optopt);
		}
	}

	if (optind < argc) {
		if (argc - optind > MAX_DEVS)
			bad_flag("at most %d devices", MAX_DEVS);
		for (int i = optind; i < argc; i++) {
			fds[ndev].fd = open(argv[i], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
			if (fds[ndev].fd < 0)
				fail("%s: %s", argv[i], strerror(errno));
			ndev++;
		}
	} else {
		double give_up = now() + WAIT_FOR_DEVICES;
		int n;

		/* The evdev module creates the nodes as it binds; wait a little. */
		while ((n = scan_devices(nums)) == 0 && now() < give_up)
			usleep(20000);
		if (n == 0)
			fail("no input event device in /dev/input (is the evdev module loaded?)");
		for (int i = 0; i < n; i++) {
			snprintf(path, sizeof(path), "/dev/input/event%d", nums[i]);
			fds[ndev].fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
			if (fds[ndev].fd < 0)
				fail("%s: %s", path, strerror(errno));
			ndev++;
		}
	}
	for (int i = 0; i < ndev; i++)
		fds[i].events = POLLIN;

	printf(PROG ": ready\n");
	fflush(stdout);

	deadline = seconds > 0 ? now() + seconds : 0;
	while (!count || printed < count) {
		int timeout = -1, ready;

		if (deadline) {
			double left = deadline - now();

			if (left <= 0)
				break;
			timeout = (int)(left * 1000) + 1;
		}
		ready = poll(fds, ndev, timeout);
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			fail("poll: %s", strerror(errno));
		}
		for (int i = 0; i < ndev && ready > 0 && (!count || printed < count); i++) {
			struct input_event ev[64];
			ssize_t len;

			if (!fds[i].revents)
				continue;
			len = read(fds[i].fd, ev, sizeof(ev));
			if (len < 0) {
				if (errno == EAGAIN || errno == EINTR)
					continue;
				/* Gone (ENODEV: unplugged): stop polling it. */
				close(fds[i].fd);
				fds[i].fd = -1;
				continue;
			}
			if (len == 0) {
				close(fds[i].fd);
				fds[i].fd = -1;
				continue;
			}
			for (size_t k = 0; k < (size_t)len / sizeof(ev[0]); k++) {
				const char *kind;

				switch (ev[k].type) {
				case EV_KEY:
					kind = ev[k].code >= 0x100 && ev[k].code < 0x160 ? "btn" : "key";
					break;
				case EV_ABS: kind = "abs"; break;
				case EV_REL: kind = "rel"; break;
				default: continue;
				}
				printf("%s %u %d\n", kind, ev[k].code, ev[k].value);
				fflush(stdout);
				if (count && ++printed >= count)
					break;
			}
		}
	}
	return 0;
}

/*
 * hk-vsock: netcat for AF_VSOCK, the guest's end of hakoniwa's vsock
 * channel (the host's end is the Unix socket given to --vsock uds=PATH).
 *
 *   hk-vsock listen PORT       accept one connection on PORT
 *   hk-vsock connect CID PORT  connect to CID:PORT (the host is CID 2)
 *
 * Then it copies stdin to the connection and the connection to stdout
 * until the peer closes; end of stdin half-closes the connection (so
 * `echo hi | hk-vsock connect 2 5000` sends and still reads the answer).
 *
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

static int usage(void)
{
	fprintf(stderr, "usage: hk-vsock listen PORT | hk-vsock connect CID PORT\n");
	return 2;
}

static unsigned parse(const char *text)
{
	char *end;
	unsigned long value = strtoul(text, &end, 0);

	if (*text == '\0' || *end != '\0' || value > 0xffffffffUL) {
		fprintf(stderr, "hk-vsock: '%s' is not a number\n", text);
		exit(2);
	}
	return (unsigned)value;
}

/* Writes all of buf; returns -1 on error. */
static int write_all(int fd, const char *buf, ssize_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf += n;
		len -= n;
	}
	return 0;
}

/* Shuttles stdin -> conn and conn -> stdout until the peer closes. */
static int relay(int conn)
{
	struct pollfd fds[2] = { { .fd = 0, .events = POLLIN }, { .fd = conn, .events = POLLIN } };
	static char buf[65536];

	for (;;) {
		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("hk-vsock: poll");
			return 1;
		}
		if (fds[1].revents) {
			ssize_t n = read(conn, buf, sizeof buf);

			if (n <= 0)
				return n < 0;
			if (write_all(1, buf, n))
				return 1;
		}
		if (fds[0].revents) {
			ssize_t n = read(0, buf, sizeof buf);

			if (n <= 0) {
				/* End of input: tell the peer, keep reading its answer. */
				shutdown(conn, SHUT_WR);
				fds[0].fd = -1;
			} else if (write_all(conn, buf, n)) {
				return 1;
			}
		}
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_vm addr = { .svm_family = AF_VSOCK };
	int sock, conn;

	if (argc == 3 && strcmp(argv[1], "listen") == 0) {
		addr.svm_cid = VMADDR_CID_ANY;
		addr.svm_port = parse(argv[2]);
	} else if (argc == 4 && strcmp(argv[1], "connect") == 0) {
		addr.svm_cid = parse(argv[2]);
		addr.svm_port = parse(argv[3]);
	} else {
		return usage();
	}
	sock = socket(AF_VSOCK, SOCK_STREAM, 0);
	if (sock < 0) {
		perror("hk-vsock: socket (is vmw_vsock_virtio_transport loaded?)");
		return 1;
	}
	if (addr.svm_cid == VMADDR_CID_ANY) {
		if (bind(sock, (struct sockaddr *)&addr, sizeof addr) || listen(sock, 1)) {
			perror("hk-vsock: listen");
			return 1;
		}
		conn = accept(sock, NULL, NULL);
		if (conn < 0) {
			perror("hk-vsock: accept");
			return 1;
		}
	} else {
		if (connect(sock, (struct sockaddr *)&addr, sizeof addr)) {
			perror("hk-vsock: connect");
			return 1;
		}
		conn = sock;
	}
	return relay(conn);
}

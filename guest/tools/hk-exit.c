/*
 * hk-exit N: end the virtual machine with exit status N (0-255).
 *
 * It writes the byte N to I/O port 0x501, hakoniwa's debug-exit port:
 * hakoniwa stops the VM and exits with status N. The port is the one QEMU's
 * `-device isa-debug-exit,iobase=0x501,iosize=1` uses, so the same guest runs
 * under QEMU for comparison; QEMU exits with status (N << 1) | 1 instead.
 *
 * The byte goes through /dev/port, so the kernel does the outb. A user-space
 * outb after ioperm() is the fallback for kernels without /dev/port: in the
 * test rig (nested KVM on QEMU TCG's emulated SVM) a user-space outb from a
 * guest faults with SIGSEGV although ioperm() allowed it, while /dev/port
 * works everywhere.
 *
 * The guest's /init runs this after the hk.cmd command, to hand the
 * command's exit status to the host. If the write returns, nothing listened
 * on the port (neither hakoniwa nor QEMU with that device): say so and exit 1,
 * and /init powers off instead.
 *
 * Built static (gcc -static -Os -s) because the guest has no C library.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/io.h>
#include <unistd.h>

#define HK_DEBUG_EXIT_PORT 0x501

int main(int argc, char **argv)
{
	char *end;
	unsigned char status;
	int fd;

	if (argc != 2 || *argv[1] == '\0') {
		fprintf(stderr, "usage: hk-exit STATUS\n");
		return 2;
	}
	status = (unsigned char)strtol(argv[1], &end, 0);
	if (*end != '\0') {
		fprintf(stderr, "usage: hk-exit STATUS\n");
		return 2;
	}

	fd = open("/dev/port", O_WRONLY);
	if (fd >= 0) {
		if (pwrite(fd, &status, 1, HK_DEBUG_EXIT_PORT) != 1)
			perror("hk-exit: write /dev/port");
	} else if (ioperm(HK_DEBUG_EXIT_PORT, 1, 1) == 0) {
		outb(status, HK_DEBUG_EXIT_PORT);
	} else {
		perror("hk-exit: ioperm(0x501)");
		return 1;
	}
	fprintf(stderr, "hk-exit: no debug-exit device at port 0x501\n");
	return 1;
}

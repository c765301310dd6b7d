//! Every kind of thread hakoniwa runs, and what each may call.
//!
//! A seccomp filter is inherited: a thread started by a filtered thread
//! runs under its parent's filter too (the kernel applies both, and the
//! stricter answer wins). So a kind's list is its own calls plus the
//! lists of every kind it starts ([`ThreadKind::starts`]); a list of its
//! own narrower than its children's would stop them.

use crate::allow::{self, AllowList, RuleError, KVMIO, UFFDIO, VFIO_TYPE};

/// A kind of thread, each with its own allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadKind {
    /// The main thread once the VM runs: waits for the VM's end, stops the
    /// vCPUs, writes a failure report, tears down.
    Main,
    /// A vCPU: KVM_RUN and the device emulation its exits reach (which
    /// may activate a virtio device and so start its worker).
    Vcpu,
    /// A virtio device's queue worker (block, net, vsock, rng, balloon,
    /// input).
    VirtioWorker,
    /// A block disk's I/O thread (the sync engine's pool).
    BlockIo,
    /// Reads the terminal for the serial console.
    ConsoleInput,
    /// Waits for SIGINT/SIGTERM/SIGHUP.
    Signals,
    /// Serves the guest agent's shadow-page reports over vsock.
    MmuAgent,
    /// Finds and sends the display's changed pixels.
    Display,
    /// Takes the framebuffer's userfaultfd write-protect faults.
    DisplayWp,
    /// Accepts VNC (or WebSocket) connections.
    VncAccept,
    /// Talks to one VNC client.
    VncClient,
    /// Accepts control API connections.
    ApiServer,
    /// Carries out one API client's requests: the control plane (pause,
    /// snapshot, migrate, dump, iotrace, display and balloon settings).
    ApiConnection,
    /// Sends the VM to a migration destination.
    MigrateOut,
    /// Reads the destination's page requests during a migration.
    MigrateRequests,
    /// Relays one TLS migration connection between the network and the
    /// migration code's local socket (either side).
    MigrateTls,
    /// Receives pages on a postcopy destination.
    PostcopyPages,
    /// Answers the guest's userfaultfd faults on a postcopy destination.
    PostcopyFaults,
    /// Writes the `--metrics` lines.
    Metrics,
    /// Steers a passed-through function's host IRQs to the VM's CPUs
    /// (`irq_affinity=on`) each time the guest enables MSI/MSI-X: reads
    /// `/proc/interrupts`, writes `/proc/irq/N/smp_affinity_list`, which
    /// the vCPU that saw the enable may not.
    IrqSteer,
}

impl ThreadKind {
    /// Every kind, in the order docs/security.md lists them.
    pub const ALL: &'static [ThreadKind] = &[
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::VirtioWorker,
        ThreadKind::BlockIo,
        ThreadKind::ConsoleInput,
        ThreadKind::Signals,
        ThreadKind::MmuAgent,
        ThreadKind::Display,
        ThreadKind::DisplayWp,
        ThreadKind::VncAccept,
        ThreadKind::VncClient,
        ThreadKind::ApiServer,
        ThreadKind::ApiConnection,
        ThreadKind::MigrateOut,
        ThreadKind::MigrateRequests,
        ThreadKind::MigrateTls,
        ThreadKind::PostcopyPages,
        ThreadKind::PostcopyFaults,
        ThreadKind::Metrics,
        ThreadKind::IrqSteer,
    ];

    /// The kind's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::VirtioWorker => "virtio-worker",
            ThreadKind::BlockIo => "block-io",
            ThreadKind::ConsoleInput => "console-in",
            ThreadKind::Signals => "signals",
            ThreadKind::MmuAgent => "mmu-agent",
            ThreadKind::Display => "display",
            ThreadKind::DisplayWp => "display-wp",
            ThreadKind::VncAccept => "vnc-accept",
            ThreadKind::VncClient => "vnc-client",
            ThreadKind::ApiServer => "api-server",
            ThreadKind::ApiConnection => "api-conn",
            ThreadKind::MigrateOut => "migrate-out",
            ThreadKind::MigrateRequests => "migrate-requests",
            ThreadKind::MigrateTls => "migrate-tls",
            ThreadKind::PostcopyPages => "postcopy-pages",
            ThreadKind::PostcopyFaults => "postcopy-faults",
            ThreadKind::Metrics => "metrics",
            ThreadKind::IrqSteer => "irq-steer",
        }
    }

    /// The kinds of thread this kind starts once its filter is on.
    pub fn starts(self) -> &'static [ThreadKind] {
        match self {
            // Activating a device (the guest's DRIVER_OK, an MMIO write)
            // starts its worker, and a disk's I/O threads.
            ThreadKind::Vcpu => &[ThreadKind::VirtioWorker, ThreadKind::BlockIo],
            ThreadKind::VirtioWorker => &[ThreadKind::BlockIo],
            ThreadKind::Display => &[ThreadKind::DisplayWp],
            ThreadKind::VncAccept => &[ThreadKind::VncClient],
            ThreadKind::ApiServer => &[ThreadKind::ApiConnection],
            // Resume restarts device workers; a migration starts its
            // thread; a switch to `dirty=wp` starts the fault thread.
            ThreadKind::ApiConnection => &[
                ThreadKind::VirtioWorker,
                ThreadKind::BlockIo,
                ThreadKind::MigrateOut,
                ThreadKind::DisplayWp,
            ],
            // A failed migration resumes the VM (its device workers); a
            // TLS connection has its pump.
            ThreadKind::MigrateOut => &[
                ThreadKind::MigrateRequests,
                ThreadKind::MigrateTls,
                ThreadKind::VirtioWorker,
                ThreadKind::BlockIo,
            ],
            // A resumed postcopy accepts a new connection: over TLS, with
            // its pump.
            ThreadKind::PostcopyPages => &[ThreadKind::MigrateTls],
            _ => &[],
        }
    }

    /// The calls of this kind's own work (without its children's).
    fn own(self) -> Result<AllowList, RuleError> {
        use libc::{AF_INET, AF_INET6, AF_UNIX};
        let list = allow::every_thread()?;
        Ok(match self {
            // Joins and tears down; a failure report is a file; the
            // terminal goes back to cooked mode.
            ThreadKind::Main => list
                .union(&allow::file_names()?)
                .union(&allow::ioctl_type(KVMIO)?)
                .union(&allow::ioctl_type(VFIO_TYPE)?)
                .union(&allow::terminal()?)
                .union(&allow::sockets(&[AF_UNIX])?),
            // KVM_RUN and every KVM ioctl of the VM and vCPU fds; VFIO
            // for a passed-through function's config space and MSI-X.
            ThreadKind::Vcpu => list
                .union(&allow::ioctl_type(KVMIO)?)
                .union(&allow::ioctl_type(VFIO_TYPE)?),
            // Disks (io_uring or pread/pwrite, flushes, discards), TAP
            // reads and writes (and the offloads the guest acked, set
            // as the device activates), vsock's Unix sockets, the balloon's
            // madvise and hole punching.
            ThreadKind::VirtioWorker => list
                .union(&allow::file_data())
                .union(&allow::sockets(&[AF_UNIX])?)
                .union(&allow::tap()?)
                .calls(&[
                    libc::SYS_timerfd_create,
                    libc::SYS_timerfd_settime,
                    libc::SYS_timerfd_gettime,
                ]),
            ThreadKind::BlockIo => list.union(&allow::file_data()),
            ThreadKind::ConsoleInput => list.union(&allow::terminal()?),
            ThreadKind::Signals => list.union(&allow::signals()),
            ThreadKind::MmuAgent => list
                .union(&allow::sockets(&[AF_UNIX])?)
                .union(&allow::ioctl_type(KVMIO)?),
            // The dirty log is a KVM ioctl; `dirty=wp` takes userfaultfd
            // (the syscall or /dev/userfaultfd).
            ThreadKind::Display => list
                .union(&allow::ioctl_type(KVMIO)?)
                .union(&allow::ioctl_type(UFFDIO)?)
                .union(&allow::sockets(&[AF_UNIX, AF_INET, AF_INET6])?)
                .calls(&[
                    // Its metrics: the process's and its own CPU time.
                    libc::SYS_getrusage,
                    libc::SYS_userfaultfd,
                    libc::SYS_openat,
                    libc::SYS_timerfd_create,
                    libc::SYS_timerfd_settime,
                    libc::SYS_timerfd_gettime,
                ]),
            ThreadKind::DisplayWp => list.union(&allow::ioctl_type(UFFDIO)?),
            ThreadKind::VncAccept | ThreadKind::VncClient => list
                .union(&allow::sockets(&[AF_UNIX, AF_INET, AF_INET6])?)
                .calls(&[
                    libc::SYS_timerfd_create,
                    libc::SYS_timerfd_settime,
                    libc::SYS_timerfd_gettime,
                ]),
            ThreadKind::ApiServer => list.union(&allow::sockets(&[AF_UNIX])?),
            // The control plane: files (snapshots, dumps, traces), TCP to
            // a migration destination, the vsock agent's Unix socket,
            // every ioctl family the VM's state lives behind, reading
            // /proc for `isolation`.
            ThreadKind::ApiConnection => list
                .union(&allow::file_names()?)
                .union(&allow::sockets(&[AF_UNIX, AF_INET, AF_INET6])?)
                .union(&allow::ioctl_type(KVMIO)?)
                .union(&allow::ioctl_type(VFIO_TYPE)?)
                .union(&allow::ioctl_type(UFFDIO)?)
                .calls(&[libc::SYS_userfaultfd]),
            ThreadKind::MigrateOut => list
                .union(&allow::file_names()?)
                .union(&allow::sockets(&[AF_UNIX, AF_INET, AF_INET6])?)
                .union(&allow::ioctl_type(KVMIO)?)
                .union(&allow::ioctl_type(VFIO_TYPE)?),
            ThreadKind::MigrateRequests => list.union(&allow::sockets(&[AF_INET, AF_INET6])?),
            // poll(2) on the TCP socket and its end of the local pair.
            ThreadKind::MigrateTls => list.union(&allow::sockets(&[AF_UNIX, AF_INET, AF_INET6])?),
            // Which thread faulted is read from /proc/self/task/TID/comm;
            // a resume over TLS makes the pump's local socket pair (the
            // pages thread accepts it).
            ThreadKind::PostcopyPages | ThreadKind::PostcopyFaults => list
                .union(&allow::sockets(if self == ThreadKind::PostcopyPages {
                    &[AF_UNIX, AF_INET, AF_INET6]
                } else {
                    &[AF_INET, AF_INET6]
                })?)
                .union(&allow::read_only_opens()?)
                .union(&allow::ioctl_type(UFFDIO)?)
                .union(&allow::ioctl_type(KVMIO)?),
            // Writes its file or FIFO; KVM's statistics are KVM ioctls
            // and reads of their fds.
            ThreadKind::Metrics => list
                .union(&allow::file_names()?)
                .union(&allow::ioctl_type(KVMIO)?),
            // Files that exist, read or written, never made.
            ThreadKind::IrqSteer => list.union(&allow::existing_file_opens()?),
        })
    }

    /// Everything a thread of this kind may call: its own calls, its
    /// children's, and starting them.
    pub fn allow_list(self) -> Result<AllowList, RuleError> {
        let mut list = self.own()?;
        let children = self.starts();
        if !children.is_empty() {
            list = list.union(&allow::spawning()?);
        }
        for child in children {
            list = list.union(&child.allow_list()?);
        }
        Ok(list)
    }
}

impl std::fmt::Display for ThreadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

//! The io_uring engine: one ring per queue. Reads and writes are readv /
//! writev SQEs over the op's iovecs (guest memory or a bounce buffer),
//! flushes are fsync with DATASYNC; the ring signals completions on an
//! eventfd registered with it, which the queue thread waits on.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{Done, EngineKind, IoEngine, IoOp, OpKind, RingSetup};
use crate::virtio::block::io::DiskBackend;

pub struct UringEngine {
    ring: IoUring,
    /// The image's descriptor; `_disk` keeps it open.
    fd: RawFd,
    _disk: Arc<dyn DiskBackend>,
    done_evt: EventFd,
    /// The ops the kernel is working on, by token: their iovecs and
    /// buffers must stay where they are until their completion is reaped.
    ops: HashMap<u16, IoOp>,
    /// Ops the ring refused, reported by `reap`.
    failed: Vec<Done>,
    /// SQEs pushed since the last `kick`.
    unsubmitted: bool,
}

impl UringEngine {
    /// A ring for `entries` ops in flight on `disk`'s descriptor.
    pub fn new(
        rings: &dyn RingSetup,
        entries: u32,
        disk: Arc<dyn DiskBackend>,
    ) -> io::Result<UringEngine> {
        let fd = disk
            .raw_fd()
            .ok_or_else(|| io::Error::other("the disk has no file descriptor"))?;
        let ring = rings.ring(entries.next_power_of_two())?;
        let done_evt = EventFd::new(EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(done_evt.as_raw_fd())?;
        Ok(UringEngine {
            ring,
            fd,
            _disk: disk,
            done_evt,
            ops: HashMap::with_capacity(entries as usize),
            failed: Vec::new(),
            unsubmitted: false,
        })
    }

    fn entry(&self, token: u16, op: &IoOp) -> squeue::Entry {
        let fd = types::Fd(self.fd);
        let count = u32::try_from(op.iovecs.len()).unwrap_or(u32::MAX);
        let entry = match op.kind {
            OpKind::Read => opcode::Readv::new(fd, op.iovecs.as_ptr(), count)
                .offset(op.offset)
                .build(),
            OpKind::Write => opcode::Writev::new(fd, op.iovecs.as_ptr(), count)
                .offset(op.offset)
                .rw_flags(if op.dsync { libc::RWF_DSYNC } else { 0 })
                .build(),
            OpKind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        };
        entry.user_data(u64::from(token))
    }

    fn fail(&mut self, token: u16, error: io::Error) {
        if let Some(op) = self.ops.remove(&token) {
            self.failed.push(Done {
                token,
                op,
                result: Err(error),
            });
            let _ = self.done_evt.write(1);
        }
    }
}

impl IoEngine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::IoUring
    }

    fn submit(&mut self, token: u16, op: IoOp) {
        let entry = self.entry(token, &op);
        if let Some(old) = self.ops.insert(token, op) {
            // A head index is in flight once at a time: the queue hands
            // it back to the driver only after its completion.
            tracing::error!("virtio-blk: request {token} submitted twice");
            self.failed.push(Done {
                token,
                op: old,
                result: Err(io::Error::other("submitted twice")),
            });
        }
        for _ in 0..2 {
            // SAFETY: the SQE points at the op's iovecs and, through
            // them, at guest memory or the op's bounce buffer. The op is
            // kept in `self.ops` until its completion is reaped, and the
            // guest memory is mapped as long as the device (which owns
            // this engine) lives; dropping the engine waits for the ring's
            // requests (see Drop).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                self.unsubmitted = true;
                return;
            }
            // The submission queue is full: hand it to the kernel.
            if let Err(e) = self.ring.submit() {
                self.fail(token, e);
                return;
            }
        }
        self.fail(
            token,
            io::Error::other("the io_uring submission queue is full"),
        );
    }

    fn kick(&mut self) {
        if !self.unsubmitted {
            return;
        }
        loop {
            match self.ring.submit() {
                Ok(_) => {
                    self.unsubmitted = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // EAGAIN / EBUSY: the SQEs stay queued; the next kick (the
                // next request, completion or drain) hands them over.
                Err(e) => {
                    tracing::warn!("virtio-blk: io_uring submission deferred: {e}");
                    return;
                }
            }
        }
    }

    fn notifier(&self) -> RawFd {
        self.done_evt.as_raw_fd()
    }

    fn reap(&mut self, done: &mut Vec<Done>) {
        let _ = self.done_evt.read();
        done.append(&mut self.failed);
        let finished: Vec<(u16, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data() as u16, cqe.result()))
            .collect();
        for (token, res) in finished {
            let Some(op) = self.ops.remove(&token) else {
                continue;
            };
            let result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            done.push(Done { token, op, result });
        }
    }

    fn in_flight(&self) -> usize {
        self.ops.len() + self.failed.len()
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The kernel may still be writing into guest memory or the ops'
        // buffers: wait for every request before they are freed.
        while !self.ops.is_empty() {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Cannot tell when the kernel is done with them: leak
                    // the buffers rather than free memory it may write.
                    tracing::error!("virtio-blk: io_uring wait failed on reset: {e}");
                    std::mem::forget(std::mem::take(&mut self.ops));
                    return;
                }
            }
            let tokens: Vec<u16> = self
                .ring
                .completion()
                .map(|cqe| cqe.user_data() as u16)
                .collect();
            for token in tokens {
                self.ops.remove(&token);
            }
        }
    }
}

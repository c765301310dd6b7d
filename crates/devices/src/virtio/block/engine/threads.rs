//! The threads engine: a few threads per queue running each op with
//! blocking system calls ([`run_blocking`]), for kernels that refuse
//! io_uring and back ends without a descriptor.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{run_blocking, Done, EngineKind, IoEngine, IoOp};
use crate::affinity::{placed, ThreadPlacement};
use crate::virtio::block::io::DiskBackend;

/// Threads per queue: enough for a few requests at once per queue
/// without a thread per request.
pub const THREADS_PER_QUEUE: usize = 4;

pub struct ThreadsEngine {
    /// Dropped first: the threads see the channel closed and end.
    jobs: Option<Sender<(u16, IoOp)>>,
    done_rx: Receiver<Done>,
    done_evt: EventFd,
    in_flight: usize,
    /// Ops that could not be handed to a thread, reported by `reap`.
    failed: Vec<Done>,
    threads: Vec<JoinHandle<()>>,
    abort: Arc<AtomicBool>,
}

impl ThreadsEngine {
    /// Starts `threads` threads named `<name><i>`, placed so.
    pub fn new(
        name: &str,
        threads: usize,
        disk: Arc<dyn DiskBackend>,
        placement: ThreadPlacement,
    ) -> io::Result<ThreadsEngine> {
        let done_evt = EventFd::new(EFD_NONBLOCK)?;
        let (job_tx, job_rx) = mpsc::channel::<(u16, IoOp)>();
        let (done_tx, done_rx) = mpsc::channel();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut engine = ThreadsEngine {
            jobs: Some(job_tx),
            done_rx,
            done_evt: done_evt.try_clone()?,
            in_flight: 0,
            failed: Vec::new(),
            threads: Vec::new(),
            abort: Arc::new(AtomicBool::new(false)),
        };
        for i in 0..threads {
            let worker = Worker {
                disk: disk.clone(),
                jobs: job_rx.clone(),
                done: done_tx.clone(),
                done_evt: done_evt.try_clone()?,
                abort: engine.abort.clone(),
            };
            let (name, placement) = (format!("{name}{i}"), placement.clone());
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    placed(name, placement, || {
                        sandbox::enter_or_exit(sandbox::ThreadKind::BlockIo);
                        worker.run()
                    })
                })?;
            engine.threads.push(thread);
        }
        Ok(engine)
    }
}

impl IoEngine for ThreadsEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Threads
    }

    fn submit(&mut self, token: u16, op: IoOp) {
        self.in_flight += 1;
        let sent = match &self.jobs {
            Some(jobs) => jobs.send((token, op)).map_err(|e| e.0),
            None => Err((token, op)),
        };
        if let Err((token, op)) = sent {
            // Every thread is gone (they only end when told to): the op
            // fails rather than being lost.
            self.failed.push(Done {
                token,
                op,
                result: Err(io::Error::other("the I/O threads are gone")),
            });
            let _ = self.done_evt.write(1);
        }
    }

    fn kick(&mut self) {}

    fn notifier(&self) -> RawFd {
        self.done_evt.as_raw_fd()
    }

    fn reap(&mut self, done: &mut Vec<Done>) {
        let _ = self.done_evt.read();
        self.in_flight -= self.failed.len();
        done.append(&mut self.failed);
        while let Ok(d) = self.done_rx.try_recv() {
            self.in_flight = self.in_flight.saturating_sub(1);
            done.push(d);
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for ThreadsEngine {
    fn drop(&mut self) {
        // Ops still waiting are dropped unanswered (the device is being
        // reset); the ones in progress complete on the disk.
        self.abort.store(true, Ordering::SeqCst);
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Worker {
    disk: Arc<dyn DiskBackend>,
    jobs: Arc<Mutex<Receiver<(u16, IoOp)>>>,
    done: Sender<Done>,
    done_evt: EventFd,
    abort: Arc<AtomicBool>,
}

impl Worker {
    fn run(self) {
        loop {
            let job = {
                let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
                jobs.recv()
            };
            let Ok((token, mut op)) = job else { return };
            if self.abort.load(Ordering::SeqCst) {
                return;
            }
            let result = run_blocking(&mut op, &*self.disk, 0);
            if self.done.send(Done { token, op, result }).is_err() {
                return;
            }
            let _ = self.done_evt.write(1);
        }
    }
}

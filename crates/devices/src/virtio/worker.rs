//! The thread that serves a device's queues, and how it is paused.
//!
//! A device's work is a [`WorkerLoop`]: a value that owns the queues and
//! whatever else the device needs, and runs on its own thread until a stop
//! eventfd is signalled. [`Worker`] runs it, and can **park** it: stopping
//! the thread hands the loop (and with it every queue's position) back to
//! the device, which may read it for a snapshot and then **resume** it on a
//! new thread exactly where it stopped. A worker may also be created parked
//! (a device restored from a snapshot waits for its vCPUs before serving).
//!
//! Most devices wait on a fixed set of descriptors: [`EpollLoop`] waits on
//! them with epoll and calls a [`WorkerHandler`]; [`spawn_worker`] and
//! [`parked_worker`] build one.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::affinity::{placed, ThreadPlacement};

/// The body of a device thread.
pub trait WorkerLoop: Send + 'static {
    /// Called once, on the caller's thread, before the first run: makes
    /// `stop` one of the things the loop waits on.
    fn prepare(&mut self, stop: &EventFd) -> std::io::Result<()>;

    /// Serves until `stop` is readable; reads it before returning, so the
    /// next run (after a park) does not stop at once.
    fn run(&mut self, stop: &EventFd);
}

/// Why a worker could not be parked or resumed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the worker thread {0} panicked; its queues are lost")]
    Panicked(String),
    #[error("cannot start the worker thread {name}: {error}")]
    Spawn { name: String, error: std::io::Error },
}

enum Thread<L> {
    Running(JoinHandle<L>),
    Parked(L),
    /// The thread panicked (or could not be started): the loop is gone.
    Lost,
}

/// A device thread running a [`WorkerLoop`], or the loop parked between
/// runs. Dropping it stops and joins the thread.
pub struct Worker<L: WorkerLoop> {
    name: String,
    stop: Arc<EventFd>,
    thread: Thread<L>,
    /// Where and how the thread runs, applied each time it starts.
    placement: ThreadPlacement,
}

impl<L: WorkerLoop> Worker<L> {
    /// A worker whose loop is ready but not running; [`resume`] starts it.
    ///
    /// [`resume`]: Worker::resume
    pub fn parked(name: String, mut body: L) -> std::io::Result<Worker<L>> {
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        body.prepare(&stop)?;
        Ok(Worker {
            name,
            stop,
            thread: Thread::Parked(body),
            placement: ThreadPlacement::anywhere(),
        })
    }

    /// Runs the thread so (from its next start).
    pub fn with_placement(mut self, placement: ThreadPlacement) -> Worker<L> {
        self.placement = placement;
        self
    }

    /// A worker whose loop runs at once.
    pub fn start(name: String, body: L) -> std::io::Result<Worker<L>> {
        let mut worker = Worker::parked(name, body)?;
        worker.resume().map_err(|e| match e {
            WorkerError::Spawn { error, .. } => error,
            other => std::io::Error::other(other.to_string()),
        })?;
        Ok(worker)
    }

    /// Stops the thread (after the event it is handling) and keeps its
    /// loop; nothing of the device runs until [`resume`]. Parking a parked
    /// worker just returns the loop.
    ///
    /// [`resume`]: Worker::resume
    pub fn park(&mut self) -> Result<&mut L, WorkerError> {
        if let Thread::Running(_) = self.thread {
            let Thread::Running(handle) = std::mem::replace(&mut self.thread, Thread::Lost) else {
                unreachable!("matched just above");
            };
            // Cannot fail short of the counter overflowing, and then the
            // eventfd is readable anyway.
            let _ = self.stop.write(1);
            match handle.join() {
                Ok(body) => self.thread = Thread::Parked(body),
                Err(_) => return Err(WorkerError::Panicked(self.name.clone())),
            }
        }
        match &mut self.thread {
            Thread::Parked(body) => Ok(body),
            _ => Err(WorkerError::Panicked(self.name.clone())),
        }
    }

    /// Runs a parked loop again on a new thread; a running worker is left
    /// alone.
    pub fn resume(&mut self) -> Result<(), WorkerError> {
        match std::mem::replace(&mut self.thread, Thread::Lost) {
            Thread::Parked(mut body) => {
                let stop = self.stop.clone();
                let (name, placement) = (self.name.clone(), self.placement.clone());
                let handle = std::thread::Builder::new()
                    .name(self.name.clone())
                    .spawn(move || {
                        placed(name, placement, || {
                            sandbox::enter_or_exit(sandbox::ThreadKind::VirtioWorker);
                            body.run(&stop);
                            body
                        })
                    })
                    .map_err(|error| WorkerError::Spawn {
                        name: self.name.clone(),
                        error,
                    })?;
                self.thread = Thread::Running(handle);
                Ok(())
            }
            Thread::Running(handle) => {
                self.thread = Thread::Running(handle);
                Ok(())
            }
            Thread::Lost => Err(WorkerError::Panicked(self.name.clone())),
        }
    }

    /// The loop, while parked.
    pub fn parked_loop(&mut self) -> Option<&mut L> {
        match &mut self.thread {
            Thread::Parked(body) => Some(body),
            _ => None,
        }
    }

    /// The loop, while parked, for reading.
    pub fn parked_ref(&self) -> Option<&L> {
        match &self.thread {
            Thread::Parked(body) => Some(body),
            _ => None,
        }
    }

    /// Whether the thread is running.
    pub fn is_running(&self) -> bool {
        matches!(self.thread, Thread::Running(_))
    }
}

impl<L: WorkerLoop> Drop for Worker<L> {
    fn drop(&mut self) {
        if let Thread::Running(handle) = std::mem::replace(&mut self.thread, Thread::Lost) {
            let _ = self.stop.write(1);
            let _ = handle.join();
        }
    }
}

/// What a device does when one of its descriptors is ready.
pub trait WorkerHandler: Send + 'static {
    /// Descriptor `token` (an index into the list given to [`spawn_worker`])
    /// is readable. Kick eventfds must be read (drained) by the handler.
    fn handle(&mut self, token: usize, events: EventSet);
}

const STOP_TOKEN: u64 = u64::MAX;

/// A [`WorkerLoop`] that waits on a fixed list of descriptors
/// (level-triggered, readable) and hands each ready one to its handler.
pub struct EpollLoop<H> {
    epoll: Epoll,
    fd_count: usize,
    handler: H,
}

impl<H: WorkerHandler> EpollLoop<H> {
    /// Waits on `fds`; token `i` is `fds[i]`.
    pub fn new(fds: &[RawFd], handler: H) -> std::io::Result<EpollLoop<H>> {
        let epoll = Epoll::new()?;
        for (token, fd) in fds.iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                *fd,
                EpollEvent::new(EventSet::IN, token as u64),
            )?;
        }
        Ok(EpollLoop {
            epoll,
            fd_count: fds.len(),
            handler,
        })
    }

    /// The handler (to read its queues while the worker is parked).
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }

    /// The handler, for reading.
    pub fn handler(&self) -> &H {
        &self.handler
    }
}

impl<H: WorkerHandler> WorkerLoop for EpollLoop<H> {
    fn prepare(&mut self, stop: &EventFd) -> std::io::Result<()> {
        self.epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP_TOKEN),
        )
    }

    fn run(&mut self, stop: &EventFd) {
        let mut events = vec![EpollEvent::default(); self.fd_count + 1];
        loop {
            let ready = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("virtio worker epoll failed: {e}");
                    return;
                }
            };
            for event in &events[..ready] {
                if event.data() == STOP_TOKEN {
                    let _ = stop.read();
                    return;
                }
                self.handler
                    .handle(event.data() as usize, event.event_set());
            }
        }
    }
}

/// Starts a worker named `name` waiting on `fds` (level-triggered, readable).
pub fn spawn_worker<H: WorkerHandler>(
    name: String,
    fds: Vec<RawFd>,
    handler: H,
) -> std::io::Result<Worker<EpollLoop<H>>> {
    Worker::start(name, EpollLoop::new(&fds, handler)?)
}

/// A worker like [`spawn_worker`]'s that is created parked.
pub fn parked_worker<H: WorkerHandler>(
    name: String,
    fds: Vec<RawFd>,
    handler: H,
) -> std::io::Result<Worker<EpollLoop<H>>> {
    Worker::parked(name, EpollLoop::new(&fds, handler)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    struct Forward(mpsc::Sender<usize>, Vec<EventFd>, usize);

    impl WorkerHandler for Forward {
        fn handle(&mut self, token: usize, _: EventSet) {
            let _ = self.1[token].read();
            self.2 += 1;
            let _ = self.0.send(token);
        }
    }

    fn kicks() -> (Vec<EventFd>, Vec<RawFd>, Vec<EventFd>) {
        let kicks: Vec<EventFd> = (0..2)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let fds = kicks.iter().map(|e| e.as_raw_fd()).collect();
        let clones = kicks.iter().map(|e| e.try_clone().unwrap()).collect();
        (kicks, fds, clones)
    }

    #[test]
    fn ready_descriptors_reach_the_handler_and_drop_stops_the_thread() {
        let (kicks, fds, clones) = kicks();
        let (tx, rx) = mpsc::channel();
        let worker = spawn_worker("test-worker".into(), fds, Forward(tx, clones, 0)).unwrap();
        kicks[1].write(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
        kicks[0].write(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        drop(worker); // joins: must not hang
    }

    #[test]
    fn a_parked_worker_keeps_its_state_and_sees_kicks_made_meanwhile() {
        let (kicks, fds, clones) = kicks();
        let (tx, rx) = mpsc::channel();
        let mut worker = parked_worker("test-parked".into(), fds, Forward(tx, clones, 0)).unwrap();
        assert!(!worker.is_running());
        kicks[0].write(1).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "ran parked"
        );
        worker.resume().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);

        // Parking returns the handler with what it counted; a kick while
        // parked is served after the resume, and a second park is harmless.
        assert_eq!(worker.park().unwrap().handler_mut().2, 1);
        assert_eq!(worker.park().unwrap().handler_mut().2, 1);
        kicks[1].write(1).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "ran parked"
        );
        worker.resume().unwrap();
        worker.resume().unwrap(); // already running: nothing happens
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
        assert_eq!(worker.park().unwrap().handler_mut().2, 2);
    }

    struct Panics;

    impl WorkerHandler for Panics {
        fn handle(&mut self, _: usize, _: EventSet) {
            panic!("handler bug");
        }
    }

    #[test]
    fn a_panicked_thread_is_an_error_not_a_hang() {
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut worker =
            spawn_worker("test-panics".into(), vec![kick.as_raw_fd()], Panics).unwrap();
        kick.write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let err = match worker.park() {
            Ok(_) => panic!("parked a thread that panicked"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("test-panics panicked"), "{err}");
        assert!(worker.resume().is_err());
    }
}

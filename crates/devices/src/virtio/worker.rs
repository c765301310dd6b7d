//! The thread that serves a device's queues: it waits on the queues' kick
//! eventfds (and any other descriptors the device needs, e.g. a TAP or a
//! socket) with epoll and calls the device's handler; a stop eventfd ends it.

use std::os::fd::{AsRawFd, RawFd};
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// What a device does when one of its descriptors is ready.
pub trait WorkerHandler: Send + 'static {
    /// Descriptor `token` (an index into the list given to [`spawn_worker`])
    /// is readable. Kick eventfds must be read (drained) by the handler.
    fn handle(&mut self, token: usize, events: EventSet);
}

/// A running worker; stops and joins it when dropped.
pub struct Worker {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

const STOP_TOKEN: u64 = u64::MAX;

/// Starts a worker named `name` waiting on `fds` (level-triggered, readable).
pub fn spawn_worker<H: WorkerHandler>(
    name: String,
    fds: Vec<RawFd>,
    mut handler: H,
) -> std::io::Result<Worker> {
    let epoll = Epoll::new()?;
    let stop = EventFd::new(EFD_NONBLOCK)?;
    epoll.ctl(
        ControlOperation::Add,
        stop.as_raw_fd(),
        EpollEvent::new(EventSet::IN, STOP_TOKEN),
    )?;
    for (token, fd) in fds.iter().enumerate() {
        epoll.ctl(
            ControlOperation::Add,
            *fd,
            EpollEvent::new(EventSet::IN, token as u64),
        )?;
    }
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        let mut events = vec![EpollEvent::default(); fds.len() + 1];
        loop {
            let ready = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("virtio worker epoll failed: {e}");
                    return;
                }
            };
            for event in &events[..ready] {
                if event.data() == STOP_TOKEN {
                    return;
                }
                handler.handle(event.data() as usize, event.event_set());
            }
        }
    })?;
    Ok(Worker {
        stop,
        thread: Some(thread),
    })
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Forward(mpsc::Sender<usize>, Vec<EventFd>);

    impl WorkerHandler for Forward {
        fn handle(&mut self, token: usize, _: EventSet) {
            let _ = self.1[token].read();
            let _ = self.0.send(token);
        }
    }

    #[test]
    fn ready_descriptors_reach_the_handler_and_drop_stops_the_thread() {
        let kicks: Vec<EventFd> = (0..2)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let fds = kicks.iter().map(|e| e.as_raw_fd()).collect();
        let (tx, rx) = mpsc::channel();
        let clones = kicks.iter().map(|e| e.try_clone().unwrap()).collect();
        let worker = spawn_worker("test-worker".into(), fds, Forward(tx, clones)).unwrap();
        kicks[1].write(1).unwrap();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(),
            1
        );
        kicks[0].write(1).unwrap();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(),
            0
        );
        drop(worker); // joins: must not hang
    }
}

//! Waiting for a socket, a wake-up and the server's shutdown at once.
//!
//! Every server thread sleeps in one of these: a listener or a client
//! socket, optionally the client's wake-up eventfd (written by `damage` and
//! `copy`), and the server-wide shutdown eventfd, which is written once and
//! never read, so it stays ready for every thread that polls it.

use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

const SOCKET: u64 = 0;
const WAKE: u64 = 1;
const SHUTDOWN: u64 = 2;

/// What became ready.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ready {
    /// Data, end of stream or an error is waiting on the socket.
    pub readable: bool,
    pub writable: bool,
    pub woken: bool,
    pub shutdown: bool,
}

pub struct Poller {
    epoll: Epoll,
    socket: RawFd,
    writable_interest: bool,
}

impl Poller {
    /// The fds must stay open as long as the poller is used.
    pub fn new(socket: RawFd, wake: Option<&EventFd>, shutdown: &EventFd) -> io::Result<Poller> {
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            socket,
            EpollEvent::new(EventSet::IN, SOCKET),
        )?;
        if let Some(wake) = wake {
            epoll.ctl(
                ControlOperation::Add,
                wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, WAKE),
            )?;
        }
        epoll.ctl(
            ControlOperation::Add,
            shutdown.as_raw_fd(),
            EpollEvent::new(EventSet::IN, SHUTDOWN),
        )?;
        Ok(Poller {
            epoll,
            socket,
            writable_interest: false,
        })
    }

    /// Whether to wake when the socket can take more bytes: only while
    /// output is queued, or a level-triggered poll would spin.
    pub fn want_writable(&mut self, on: bool) -> io::Result<()> {
        if on == self.writable_interest {
            return Ok(());
        }
        let events = if on {
            EventSet::IN | EventSet::OUT
        } else {
            EventSet::IN
        };
        self.epoll.ctl(
            ControlOperation::Modify,
            self.socket,
            EpollEvent::new(events, SOCKET),
        )?;
        self.writable_interest = on;
        Ok(())
    }

    /// Sleeps until something is ready or `timeout` (forever if `None`)
    /// passes.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Ready> {
        let ms = match timeout {
            None => -1,
            // Round up so a short positive timeout does not become a spin.
            Some(t) => i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
        };
        let mut events = [EpollEvent::default(); 3];
        let n = match self.epoll.wait(ms, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        let mut ready = Ready::default();
        for ev in &events[..n] {
            let set = ev.event_set();
            match ev.data() {
                SOCKET => {
                    // Hang-ups and errors surface through the next read.
                    ready.readable |=
                        set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR);
                    ready.writable |= set.contains(EventSet::OUT);
                }
                WAKE => ready.woken = true,
                _ => ready.shutdown = true,
            }
        }
        Ok(ready)
    }
}

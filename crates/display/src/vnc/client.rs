//! What one client still has to be told, shared between the threads that
//! report screen changes (`damage`, `copy`) and the client's session
//! thread. The lock guards only bookkeeping, never I/O or encoding, so the
//! reporting side cannot be held up by a slow client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use super::region::Region;
use crate::geometry::Rect;

/// At most this many CopyRects wait for one client; later copies become
/// damage. Bounds memory for a client that stops asking for updates.
const MAX_QUEUED_COPIES: usize = 32;

/// Pixels moved on the Screen: `dst` now holds what `src` held (same size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyOp {
    pub src: Rect,
    pub dst: Rect,
}

/// What the next update to this client must carry.
#[derive(Default)]
struct Pending {
    /// Where the client's picture may differ from the Screen.
    damage: Region,
    /// Moves to replay on the client, in order, before `damage`.
    copies: Vec<CopyOp>,
    /// The client announced CopyRect.
    copyrect: bool,
}

/// An update's work, taken out of the shared state by the session.
pub struct UpdateWork {
    pub copies: Vec<CopyOp>,
    /// Disjoint rectangles to send from the Screen.
    pub rects: Vec<Rect>,
}

pub struct Client {
    pub peer: SocketAddr,
    /// Written (never blocking: the eventfd is non-blocking and a counter
    /// overflow just means a wake-up is already due) when there is news.
    pub wake: EventFd,
    /// The RFB handshake finished; counted by `VncServer::clients`.
    active: AtomicBool,
    pending: Mutex<Pending>,
}

impl Client {
    /// A new client whose view of the screen is unknown: everything
    /// starts out damaged (`screen`), so even an incremental first request
    /// sends the whole picture and no CopyRect can copy garbage.
    pub fn new(peer: SocketAddr, wake: EventFd, screen: Rect) -> Client {
        let mut pending = Pending::default();
        pending.damage.add(screen);
        Client {
            peer,
            wake,
            active: AtomicBool::new(false),
            pending: Mutex::new(pending),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // The state stays consistent even if a holder panicked: every
        // update to it is a single push or take.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        let _ = self.wake.write(1);
    }

    pub fn set_active(&self) {
        self.active.store(true, Ordering::Release);
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// These rectangles (already clipped to the screen) changed.
    pub fn damage(&self, rects: &[Rect]) {
        {
            let mut p = self.lock();
            for r in rects {
                p.damage.add(*r);
            }
        }
        self.notify();
    }

    /// Pixels moved (rectangles already clipped to the screen). A CopyRect
    /// is only worth queueing when the client holds the source's current
    /// content: pending damage over the source means the client would copy
    /// stale pixels, so send the destination instead.
    pub fn copy(&self, op: CopyOp) {
        {
            let mut p = self.lock();
            if p.copyrect && p.copies.len() < MAX_QUEUED_COPIES && !p.damage.intersects(&op.src) {
                p.copies.push(op);
            } else {
                p.damage.add(op.dst);
            }
        }
        self.notify();
    }

    /// The client's SetEncodings said whether it takes CopyRect. Dropping
    /// it turns queued copies into damage at their destinations (all of
    /// them: a later copy may read an earlier one's destination).
    pub fn set_copyrect(&self, on: bool) {
        let mut p = self.lock();
        p.copyrect = on;
        if !on {
            let copies = std::mem::take(&mut p.copies);
            for c in copies {
                p.damage.add(c.dst);
            }
        }
    }

    /// Takes the work of an update answering a request for `area`: all
    /// queued copies and the damage inside `area` (damage outside stays for
    /// a later request). `None` when there is nothing to send and the
    /// request may wait (`must_answer` false: incremental requests).
    pub fn take_update(&self, area: &Rect, must_answer: bool) -> Option<UpdateWork> {
        let mut p = self.lock();
        if p.copies.is_empty() && !p.damage.intersects(area) && !must_answer {
            return None;
        }
        let copies = std::mem::take(&mut p.copies);
        let rects = p.damage.take_within(area);
        Some(UpdateWork { copies, rects })
    }
}

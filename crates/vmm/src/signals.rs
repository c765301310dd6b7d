//! SIGINT, SIGTERM and SIGHUP end the VM cleanly. They are blocked in every
//! thread and collected by one thread with `sigwait`, which turns them into
//! a [`VmmEvent`]: no work happens in a signal handler.

use crate::event::{EventSender, VmmEvent};
use crate::Error;

const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn stop_signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for these calls to edit.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
    }
    set
}

/// Blocks the stop signals in the calling thread, and so in every thread it
/// starts afterwards. Call it first, from the main thread.
pub fn block_stop_signals() -> Result<(), Error> {
    let set = stop_signal_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(Error::Signal(
            std::io::Error::from_raw_os_error(rc).to_string(),
        ));
    }
    Ok(())
}

/// Starts the thread that waits for a stop signal and reports it.
pub fn spawn_signal_thread(events: EventSender) -> Result<(), Error> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            sandbox::enter_or_exit(sandbox::ThreadKind::Signals);
            let set = stop_signal_set();
            loop {
                let mut signal: libc::c_int = 0;
                // SAFETY: `set` is initialised and `signal` is a valid out-pointer.
                if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                    events.send(VmmEvent::Signal(signal));
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(|e| Error::Signal(e.to_string()))
}

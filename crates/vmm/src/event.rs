//! Why a VM ends, and the channel that carries it to the VMM's main thread.

use std::sync::mpsc;

use devices::PlatformExit;

/// Something that ends the VM. The first one the main thread receives wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmmEvent {
    /// The guest asked: power off, reboot or debug-exit.
    Guest(PlatformExit),
    /// A vCPU triple-faulted (KVM_EXIT_SHUTDOWN): a reset on real hardware.
    TripleFault,
    /// SIGINT, SIGTERM or SIGHUP reached the VMM.
    Signal(i32),
    /// The user typed the console escape (Ctrl-A x).
    UserQuit,
    /// The control API asked for shutdown.
    ApiShutdown,
    /// Something failed inside the VMM.
    Error(String),
    /// The VM was migrated away (the message says where): this copy ends.
    Migrated(String),
}

/// Sending half of the event channel. Sending never fails the sender: once
/// the main thread stopped listening, the VM is ending anyway.
#[derive(Clone)]
pub struct EventSender(mpsc::Sender<VmmEvent>);

impl EventSender {
    pub fn send(&self, event: VmmEvent) {
        let _ = self.0.send(event);
    }
}

/// A new event channel.
pub fn channel() -> (EventSender, mpsc::Receiver<VmmEvent>) {
    let (tx, rx) = mpsc::channel();
    (EventSender(tx), rx)
}

/// How hakoniwa's process ends for an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Process exit status.
    pub status: i32,
    /// A line for stderr, if the user should be told something.
    pub message: Option<String>,
}

/// hakoniwa's own failures exit with this status, so they are not confused
/// with a guest command's status (the convention of `docker run`).
pub const VMM_FAILURE_STATUS: i32 = 125;

/// Maps the ending event to the process outcome. With `--exec`, the guest
/// is expected to report the command's status through the debug-exit port;
/// ending any other way means the command's status is unknown.
pub fn outcome(event: &VmmEvent, exec_mode: bool) -> Outcome {
    let unreported = |how: &str| {
        if exec_mode {
            Outcome {
                status: 1,
                message: Some(format!(
                    "the guest {how} before reporting the command's exit status"
                )),
            }
        } else {
            Outcome {
                status: 0,
                message: Some(format!("the guest {how}")),
            }
        }
    };
    match event {
        VmmEvent::Guest(PlatformExit::DebugExit(status)) => Outcome {
            status: i32::from(*status),
            message: None,
        },
        VmmEvent::Guest(PlatformExit::PowerOff) => unreported("powered off"),
        VmmEvent::Guest(PlatformExit::Reboot) => unreported("rebooted"),
        VmmEvent::TripleFault => Outcome {
            status: if exec_mode { 1 } else { 0 },
            message: Some("the guest triple-faulted (CPU reset)".into()),
        },
        VmmEvent::Signal(signal) => Outcome {
            status: 128 + signal,
            message: Some(format!("stopped by signal {}", signal_name(*signal))),
        },
        VmmEvent::UserQuit => Outcome {
            status: 0,
            message: Some("quit from the console (Ctrl-A x)".into()),
        },
        VmmEvent::ApiShutdown => Outcome {
            status: 0,
            message: Some("shut down through the API".into()),
        },
        VmmEvent::Error(message) => Outcome {
            status: VMM_FAILURE_STATUS,
            message: Some(message.clone()),
        },
        VmmEvent::Migrated(message) => Outcome {
            status: 0,
            message: Some(message.clone()),
        },
    }
}

fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_exit_byte_is_the_status() {
        let o = outcome(&VmmEvent::Guest(PlatformExit::DebugExit(7)), true);
        assert_eq!(
            o,
            Outcome {
                status: 7,
                message: None
            }
        );
    }

    #[test]
    fn poweroff_is_success_interactively_but_not_for_exec() {
        assert_eq!(
            outcome(&VmmEvent::Guest(PlatformExit::PowerOff), false).status,
            0
        );
        assert_eq!(
            outcome(&VmmEvent::Guest(PlatformExit::Reboot), false).status,
            0
        );
        let o = outcome(&VmmEvent::Guest(PlatformExit::Reboot), true);
        assert_eq!(o.status, 1);
        assert!(o.message.unwrap().contains("rebooted"));
    }

    #[test]
    fn signals_use_the_shell_convention() {
        let o = outcome(&VmmEvent::Signal(libc::SIGTERM), false);
        assert_eq!(o.status, 143);
        assert!(o.message.unwrap().contains("SIGTERM"));
    }

    #[test]
    fn vmm_errors_have_their_own_status() {
        let o = outcome(&VmmEvent::Error("boom".into()), true);
        assert_eq!(o.status, VMM_FAILURE_STATUS);
    }
}

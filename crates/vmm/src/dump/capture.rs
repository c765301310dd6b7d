//! One vCPU's state as a failure report needs it, read on the vCPU's own
//! thread: right after the exit that ended it (a triple fault, a KVM
//! internal error), as it leaves its loop when the VM stops after such a
//! failure, or while parked for `ctl dump`.

use std::sync::{Arc, Mutex};

use kvm_bindings::{kvm_lapic_state, kvm_regs, kvm_sregs, kvm_vcpu_events};
use kvm_ioctls::VcpuFd;

/// What one vCPU was doing.
#[derive(Clone)]
pub struct VcpuCapture {
    pub index: u8,
    /// Why it was read: its last exit ("shutdown (triple fault)"), or
    /// "stopped" / "paused" for a vCPU that was merely running.
    pub exit: String,
    pub regs: Option<kvm_regs>,
    pub sregs: Option<kvm_sregs>,
    pub events: Option<kvm_vcpu_events>,
    pub mp_state: Option<u32>,
    pub lapic: Option<kvm_lapic_state>,
    /// The ioctls that failed, and how.
    pub errors: Vec<String>,
}

/// Reads vCPU `index`'s registers, pending events, MP state and LAPIC.
/// Never fails: what KVM refuses is left out and said in `errors`.
pub fn capture_vcpu(fd: &VcpuFd, index: u8, exit: impl Into<String>) -> VcpuCapture {
    let mut errors = Vec::new();
    let mut note = |what: &str, e: kvm_ioctls::Error| errors.push(format!("{what}: {e}"));
    let regs = fd.get_regs().map_err(|e| note("KVM_GET_REGS", e)).ok();
    let sregs = fd.get_sregs().map_err(|e| note("KVM_GET_SREGS", e)).ok();
    let events = fd
        .get_vcpu_events()
        .map_err(|e| note("KVM_GET_VCPU_EVENTS", e))
        .ok();
    let mp_state = fd
        .get_mp_state()
        .map(|m| m.mp_state)
        .map_err(|e| note("KVM_GET_MP_STATE", e))
        .ok();
    let lapic = fd.get_lapic().map_err(|e| note("KVM_GET_LAPIC", e)).ok();
    VcpuCapture {
        index,
        exit: exit.into(),
        regs,
        sregs,
        events,
        mp_state,
        lapic,
        errors,
    }
}

/// Captures handed from vCPU threads to whoever writes the report.
#[derive(Clone, Default)]
pub struct Captures(Arc<Mutex<Vec<VcpuCapture>>>);

impl Captures {
    /// Keeps `capture`, replacing an older one of the same vCPU unless
    /// that one recorded the failure itself (a real exit beats "stopped").
    pub fn put(&self, capture: VcpuCapture) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match all.iter_mut().find(|c| c.index == capture.index) {
            Some(old) if old.exit != "stopped" && capture.exit == "stopped" => {}
            Some(old) => *old = capture,
            None => all.push(capture),
        }
    }

    /// Whether a vCPU recorded a failure (not only a stop).
    pub fn has_failure(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|c| c.exit != "stopped")
    }

    /// Every capture so far, by vCPU index; empties the box.
    pub fn take(&self) -> Vec<VcpuCapture> {
        let mut all = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        all.sort_by_key(|c| c.index);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(index: u8, exit: &str) -> VcpuCapture {
        VcpuCapture {
            index,
            exit: exit.into(),
            regs: None,
            sregs: None,
            events: None,
            mp_state: None,
            lapic: None,
            errors: vec![],
        }
    }

    #[test]
    fn a_failure_is_not_overwritten_by_the_stop_that_follows() {
        let box_ = Captures::default();
        assert!(!box_.has_failure());
        box_.put(capture(1, "stopped"));
        assert!(!box_.has_failure());
        box_.put(capture(0, "shutdown (triple fault)"));
        box_.put(capture(0, "stopped"));
        assert!(box_.has_failure());
        let all = box_.take();
        let exits: Vec<(u8, &str)> = all.iter().map(|c| (c.index, c.exit.as_str())).collect();
        assert_eq!(exits, vec![(0, "shutdown (triple fault)"), (1, "stopped")]);
        assert!(box_.take().is_empty());
    }
}

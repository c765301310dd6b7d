//! Taking a snapshot of a running VM: with every vCPU parked, each vCPU
//! thread saves its own state, then the VM-wide state, COM1 and RAM are
//! written.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use devices::legacy::Serial;
use kvm_ioctls::VmFd;

use super::file::write_snapshot;
use super::state::{DeviceStates, MachineState, VmSnapshot};
use super::vcpu_state::save_vcpu;
use super::vm_state::save_vm;
use super::SnapshotError;
use crate::memory::GuestMemoryMmap;
use crate::vcpu::{RunControl, Vcpu};

/// How long a parked vCPU thread may take to save its state.
const VCPU_SAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a running VM keeps so the API can snapshot it.
pub struct SnapshotSource {
    vm_fd: Arc<VmFd>,
    memory: GuestMemoryMmap,
    serial: Arc<Mutex<Serial>>,
    machine: MachineState,
    msr_indices: Arc<Vec<u32>>,
    /// Set when the VM has state this version cannot save: (what, flags).
    unsupported: Option<(String, String)>,
    /// One snapshot at a time.
    busy: Mutex<()>,
}

impl SnapshotSource {
    /// `msr_indices` is KVM_GET_MSR_INDEX_LIST; `unsupported` names what
    /// the VM has that a snapshot cannot hold yet (see
    /// [`super::restore::unsupported`]).
    pub fn new(
        vm_fd: Arc<VmFd>,
        memory: GuestMemoryMmap,
        serial: Arc<Mutex<Serial>>,
        machine: MachineState,
        msr_indices: Vec<u32>,
        unsupported: Option<(String, String)>,
    ) -> Self {
        SnapshotSource {
            vm_fd,
            memory,
            serial,
            machine,
            msr_indices: Arc::new(msr_indices),
            unsupported,
            busy: Mutex::new(()),
        }
    }

    /// Refuses VMs whose state a snapshot cannot hold yet.
    pub fn check_supported(&self) -> Result<(), SnapshotError> {
        match &self.unsupported {
            Some((what, flags)) => Err(SnapshotError::Unsupported {
                what: what.clone(),
                flags: flags.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Saves the VM to `path`; every vCPU must be parked (paused) and stay
    /// so until this returns. Returns the file's size.
    pub fn save(&self, path: &Path, control: &RunControl) -> Result<u64, SnapshotError> {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = self.collect(control)?;
        write_snapshot(path, &snapshot, &self.memory)
    }

    /// Gathers the whole VM's state except RAM: each vCPU's on its own
    /// thread, then the VM-wide KVM state and the devices'. Every vCPU must
    /// be parked (paused) and stay so until the state has been used (saved
    /// to a file, or sent to a migration's destination).
    pub fn collect(&self, control: &RunControl) -> Result<VmSnapshot, SnapshotError> {
        self.check_supported()?;
        let mut vcpus = Vec::with_capacity(usize::from(self.machine.vcpus));
        for index in 0..self.machine.vcpus {
            let (reply, answer) = mpsc::channel();
            let msr_indices = self.msr_indices.clone();
            control
                .run_on_vcpu(
                    index,
                    Box::new(move |vcpu: &mut Vcpu| {
                        // An I/O exit is complete (RIP past the instruction,
                        // IN data in the register) only after KVM_RUN is
                        // entered again; do that without running the guest.
                        let state = vcpu
                            .complete_pending_io()
                            .map_err(|e| SnapshotError::Invalid(format!("vCPU {index}: {e}")))
                            .and_then(|()| save_vcpu(&vcpu.fd, index, &msr_indices));
                        let _ = reply.send(state);
                    }),
                )
                .map_err(SnapshotError::Invalid)?;
            let state = answer.recv_timeout(VCPU_SAVE_TIMEOUT).map_err(|_| {
                SnapshotError::Invalid(format!("vCPU {index} did not save its state"))
            })??;
            vcpus.push(state);
        }
        let vm = save_vm(&self.vm_fd)?;
        let com1 = self
            .serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state()
            .into();
        Ok(VmSnapshot {
            machine: self.machine.clone(),
            vm,
            vcpus,
            devices: DeviceStates { com1 },
        })
    }

    /// The machine this VM is: what a restore or a migration's destination
    /// must build to take its state.
    pub fn machine(&self) -> &MachineState {
        &self.machine
    }

    /// Guest RAM.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }
}

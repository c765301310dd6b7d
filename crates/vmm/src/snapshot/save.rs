//! Taking a snapshot of a running VM: with every vCPU parked, the virtio
//! devices are paused and their state taken, each vCPU thread saves its
//! own state, the disk images are flushed, then the VM-wide state, COM1
//! and RAM are written, and the devices resume.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use devices::legacy::Serial;

use super::file::write_snapshot;
use super::state::{DeviceStates, MachineState, VmSnapshot};
use super::vcpu_state::save_vcpu;
use super::vm_state::save_vm;
use super::SnapshotError;
use crate::disks::Disks;
use crate::display::Framebuffer;
use crate::memory::{GuestMemoryMmap, MemoryManager};
use crate::platform::VirtioFunctions;
use crate::vcpu::{RunControl, Vcpu};

/// How long a parked vCPU thread may take to save its state.
const VCPU_SAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a running VM keeps so the API can snapshot it.
pub struct SnapshotSource {
    memory: Arc<MemoryManager>,
    serial: Arc<Mutex<Serial>>,
    machine: MachineState,
    msr_indices: Arc<Vec<u32>>,
    /// The virtio functions, paused by `collect` until `resume_devices`.
    virtio: Option<VirtioFunctions>,
    /// The display's framebuffer, whose pixels are saved with the devices.
    framebuffer: Option<Arc<Framebuffer>>,
    /// The disk images, flushed before the state leaves.
    disks: Disks,
    /// One snapshot at a time.
    busy: Mutex<()>,
}

impl SnapshotSource {
    /// `msr_indices` is KVM_GET_MSR_INDEX_LIST.
    pub fn new(
        memory: Arc<MemoryManager>,
        serial: Arc<Mutex<Serial>>,
        machine: MachineState,
        msr_indices: Vec<u32>,
    ) -> Self {
        SnapshotSource {
            memory,
            serial,
            machine,
            msr_indices: Arc::new(msr_indices),
            virtio: None,
            framebuffer: None,
            disks: Disks::default(),
            busy: Mutex::new(()),
        }
    }

    /// Saves (and restores) `functions`, the VM's virtio devices, too.
    /// A VM that has virtio devices must give them here: without them a
    /// snapshot cannot be restored.
    pub fn with_virtio(mut self, functions: VirtioFunctions) -> Self {
        self.virtio = Some(functions);
        self
    }

    /// Flushes `disks` before a snapshot is written, and hands them over
    /// at a migration's switch-over.
    pub fn with_disks(mut self, disks: Disks) -> Self {
        self.disks = disks;
        self
    }

    /// Saves (and restores) the display's pixels too.
    pub fn with_framebuffer(mut self, framebuffer: Option<Arc<Framebuffer>>) -> Self {
        self.framebuffer = framebuffer;
        self
    }

    /// Saves the VM to `path`; every vCPU must be parked (paused) and stay
    /// so until this returns. The virtio devices are paused while RAM is
    /// written and resumed before this returns, whatever happens. Returns
    /// the file's size.
    pub fn save(&self, path: &Path, control: &RunControl) -> Result<u64, SnapshotError> {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = self.collect(control)?;
        // The snapshot refers to the images as they are now: what the
        // guest wrote must be durable before the file says so.
        let written = match self.disks.flush() {
            Ok(()) => write_snapshot(path, &snapshot, self.memory.ram()),
            Err(e) => Err(SnapshotError::Disk(e)),
        };
        let resumed = self.resume_devices();
        let size = written?;
        resumed?;
        Ok(size)
    }

    /// A migration's switch-over, devices paused by
    /// [`collect`](Self::collect): flushes every disk image and releases
    /// its locks for the destination.
    pub fn hand_over_disks(&self) -> Result<(), SnapshotError> {
        self.disks.hand_over().map_err(SnapshotError::Disk)
    }

    /// A migration that handed the disks over failed before the
    /// destination ran the guest: locks them again, so the guest can go on
    /// here (fails if the destination took them meanwhile).
    pub fn take_back_disks(&self) -> Result<(), SnapshotError> {
        self.disks.lock().map_err(SnapshotError::Disk)
    }

    /// Gathers the whole VM's state except RAM. Every vCPU must be parked
    /// (paused) and stay so until the state has been used (saved to a
    /// file, or sent to a migration's destination).
    ///
    /// The virtio devices are paused first (their requests in flight
    /// completed, their workers stopped) and **stay paused** when this
    /// returns `Ok`: they would otherwise go on writing guest RAM, which
    /// must be copied as it is with this state. The caller must then call
    /// [`resume_devices`](Self::resume_devices) before the vCPUs run again
    /// (the snapshot was written, or a migration failed), or end the VM.
    /// On `Err` nothing stays paused.
    ///
    /// The devices go first because completing their requests raises
    /// interrupts, which must reach the LAPICs before the vCPUs' state is
    /// read.
    pub fn collect(&self, control: &RunControl) -> Result<VmSnapshot, SnapshotError> {
        let virtio = match &self.virtio {
            Some(functions) => functions.pause_and_save()?,
            None => Default::default(),
        };
        self.collect_paused(control, virtio).inspect_err(|_| {
            let _ = self.resume_devices();
        })
    }

    /// Lets the virtio devices paused by [`collect`](Self::collect) serve
    /// again, from where they stopped.
    pub fn resume_devices(&self) -> Result<(), SnapshotError> {
        match &self.virtio {
            Some(functions) => Ok(functions.resume()?),
            None => Ok(()),
        }
    }

    fn collect_paused(
        &self,
        control: &RunControl,
        virtio: std::collections::BTreeMap<String, devices::virtio::pci::VirtioPciState>,
    ) -> Result<VmSnapshot, SnapshotError> {
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
        let vm = save_vm(self.memory.vm_fd())?;
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
            devices: DeviceStates {
                com1,
                virtio,
                display: self.framebuffer.as_ref().map(|fb| fb.save()),
            },
        })
    }

    /// The machine this VM is: what a restore or a migration's destination
    /// must build to take its state.
    pub fn machine(&self) -> &MachineState {
        &self.machine
    }

    /// Guest RAM.
    pub fn memory(&self) -> &GuestMemoryMmap {
        self.memory.ram()
    }
}

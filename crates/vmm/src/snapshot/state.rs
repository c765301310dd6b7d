//! The serializable state of a VM: what a snapshot's metadata section
//! holds. KVM's own structures are kept whole (kvm-bindings serializes them
//! as their raw bytes), so nothing KVM reports is lost in translation.

use std::collections::BTreeMap;

use devices::virtio::pci::VirtioPciState;
use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use serde::{Deserialize, Serialize};

/// Everything about a VM except its RAM, which follows in the file.
#[derive(Serialize, Deserialize)]
pub struct VmSnapshot {
    /// How the VM was built; a restore must build the same machine.
    pub machine: MachineState,
    /// VM-wide KVM state: interrupt controllers, PIT, clock.
    pub vm: VmLevelState,
    /// One entry per vCPU, in index order.
    pub vcpus: Vec<VcpuState>,
    /// The platform devices that hold state outside KVM.
    pub devices: DeviceStates,
}

/// The shape of the machine: what `run --restore` checks its flags against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineState {
    /// Guest RAM in bytes (`--memory`).
    pub memory_bytes: u64,
    /// Number of vCPUs (`--cpus`).
    pub vcpus: u8,
    /// Guest RAM regions (guest-physical start, length) in file order.
    pub ram_regions: Vec<(u64, u64)>,
    /// Device ids and kinds, as `vm.info` lists them.
    pub devices: Vec<(String, String)>,
    /// How the guest was booted (`linux-64bit`, `pvh`), for `vm.info`.
    pub boot_protocol: String,
    /// The kernel and command line it was booted with, for `vm.info`.
    pub kernel: String,
    pub cmdline: String,
    /// The display's geometry ("1024x768 tiled"), if it has one.
    #[serde(default)]
    pub display: Option<String>,
}

/// The in-kernel irqchip, PIT and kvm-clock.
#[derive(Serialize, Deserialize)]
pub struct VmLevelState {
    /// KVM_GET_IRQCHIP of the master PIC, the slave PIC and the IOAPIC.
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    /// KVM_GET_PIT2.
    pub pit: kvm_pit_state2,
    /// KVM_GET_CLOCK: the kvm-clock's value when the VM was paused.
    pub clock: kvm_clock_data,
}

/// One MSR's index and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrValue {
    pub index: u32,
    pub data: u64,
}

/// One vCPU's architectural and KVM-internal state.
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    pub index: u8,
    /// KVM_GET_CPUID2: what the guest was shown.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub mp_state: kvm_mp_state,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// KVM_GET_XSAVE: x87, SSE and AVX state (the legacy 4 KiB area).
    pub xsave: kvm_xsave,
    /// KVM_GET_XCRS (absent where KVM has no XSAVE support).
    pub xcrs: Option<kvm_xcrs>,
    pub debug_regs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    /// Every MSR KVM lists (KVM_GET_MSR_INDEX_LIST) that it could read for
    /// this vCPU, TSC and kvm-clock MSRs included.
    pub msrs: Vec<MsrValue>,
    pub vcpu_events: kvm_vcpu_events,
    /// KVM_GET_TSC_KHZ, for information (restore keeps the host's rate).
    pub tsc_khz: Option<u32>,
}

/// State of the devices that live outside KVM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStates {
    /// COM1 (16550A).
    pub com1: SerialRegisters,
    /// Each virtio-pci function by device id ("disk0", "rng0", ...): PCI
    /// configuration, MSI-X, transport registers, queue positions and the
    /// device's own state.
    pub virtio: BTreeMap<String, VirtioPciState>,
    /// The display's framebuffer, if the VM has a display.
    #[serde(default)]
    pub display: Option<FramebufferState>,
}

/// The pixels of the display's framebuffer: its memory is a slot of its
/// own, outside RAM, so it travels with the devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FramebufferState {
    /// The framebuffer's bytes (every mapped page), base64.
    pub pixels: String,
}

/// vm-superio's `SerialState`, in a form serde can write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialRegisters {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    /// Bytes typed but not yet read by the guest.
    pub in_buffer: Vec<u8>,
}

impl From<devices::legacy::serial::SerialState> for SerialRegisters {
    fn from(s: devices::legacy::serial::SerialState) -> Self {
        SerialRegisters {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<&SerialRegisters> for devices::legacy::serial::SerialState {
    fn from(s: &SerialRegisters) -> Self {
        devices::legacy::serial::SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}

impl VmSnapshot {
    /// A one-vCPU VM's state for `machine`, KVM structures zeroed (no KVM
    /// needed), with a serial port and a virtio-rng function: for the
    /// snapshot file's tests and the fuzz targets' seeds, not for a VM.
    #[doc(hidden)]
    pub fn sample(machine: &MachineState) -> VmSnapshot {
        let json = serde_json::json!({
            "machine": machine,
            "vm": {"pic_master": [], "pic_slave": [], "ioapic": [], "pit": [], "clock": []},
            "vcpus": [{
                "index": 0, "cpuid": [], "mp_state": [], "regs": [], "sregs": [], "xsave": [],
                "xcrs": null, "debug_regs": [], "lapic": [], "vcpu_events": [], "tsc_khz": 1000,
                "msrs": [{"index": 16, "data": 12345}]
            }],
            "devices": {"com1": {
                "baud_divisor_low": 12, "baud_divisor_high": 0, "interrupt_enable": 1,
                "interrupt_identification": 1, "line_control": 3, "line_status": 96,
                "modem_control": 8, "modem_status": 176, "scratch": 7, "in_buffer": [104, 105]
            }, "virtio": {"rng0": {
                "device_type": 4, "config_space": vec![0u32; 64], "bar_address": 0xc000_0000u64,
                "msix": {"entries": [{"address_lo": 0xfee0_0000u32, "address_hi": 0, "data": 34,
                    "control": 0}, {"address_lo": 0, "address_hi": 0, "data": 0, "control": 1}],
                    "pending": [false, true]},
                "status": 15, "device_feature_select": 1, "driver_feature_select": 1,
                "driver_features": 0x1_3000_0000u64, "queue_select": 0, "config_generation": 0,
                "config_vector": 65535, "isr": 0, "activated": true,
                "queues": [{"size": 256, "ready": true, "desc": 0x1000, "driver": 0x2000,
                    "device": 0x3000, "vector": 0, "next_avail": 7, "next_used": 6}],
                "device": {"device": "rng"}
            }}}
        });
        serde_json::from_value(json).expect("the sample state matches VmSnapshot")
    }
}

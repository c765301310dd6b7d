//! A host PCI function on the guest's PCI bus through VFIO: what
//! crate::vfio::config decides, done with the VFIO device and KVM.
//!
//! - BARs: each mappable area (VFIO's sparse areas, less the pages of the
//!   MSI-X table and PBA) is mmapped from the device and given to the guest
//!   as a KVM memory slot, so the guest's accesses never exit; the rest of
//!   the BAR is on the MMIO bus and goes through VFIO's region read/write.
//!   When the guest moves a BAR, its slots and bus range follow.
//! - Interrupts: each MSI-X or MSI vector is a KVM GSI with an irqfd
//!   (crate::interrupt); VFIO is handed those irqfds, so the device's
//!   interrupt goes host IRQ → eventfd → KVM → vCPU with no VMM thread. The
//!   MSI-X table stays ours (trapped): its messages become KVM routes.
//!   INTx, while neither is enabled, is a level-triggered IOAPIC line
//!   (crate::interrupt::IntxLine): VFIO signals its trigger eventfd, an
//!   irqfd with resample, and takes the resample eventfd as its unmask
//!   eventfd, so the guest's EOI unmasks the host's INTx with no VMM
//!   thread either.
//! - The function is reset when it is opened and when the VM lets it go.

use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_PCI_MSI_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioDevice, VfioRegionInfoCap};
use vmm_sys_util::eventfd::EventFd;

use super::config::{
    mappable_areas, ConfigWrite, GuestConfig, HostLayout, IntxState, MsiConfig, CONFIG_SIZE,
};
use super::host::HostDevice;
use crate::bus::BusDevice;
use crate::interrupt::{IntxLine, MsiMessage, MsiRouting, MsiVector};
use crate::pci::msix::Msix;
use crate::pci::{BarAllocator, BarMove, PciDevice};

const PAGE_SIZE: u64 = 4096;

/// Gives device memory to the guest: the VMM's memory manager, the one
/// owner of KVM's memory slots.
pub trait GuestMapper: Send + Sync {
    /// Maps `len` bytes at our `host` address into the guest at
    /// `guest_address` in a slot of its own; returns the slot.
    ///
    /// # Safety
    ///
    /// `[host, host + len)` must be a mapping that `owner` keeps alive, and
    /// the guest range must not overlap RAM or another slot.
    unsafe fn map(
        &self,
        host: *mut u8,
        len: usize,
        guest_address: u64,
        owner: Arc<dyn Send + Sync>,
    ) -> Result<u32, String>;

    /// Moves `slot` to `guest_address` (the guest moved a BAR).
    fn move_to(&self, slot: u32, guest_address: u64) -> Result<(), String>;
}

/// One mmap of a device region; unmapped when the last owner (the device
/// or the KVM slot's keeper) lets it go.
struct DeviceMapping {
    address: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is device memory shared with the device and the
// guest; it is only ever touched through KVM (never by reference here), and
// munmap may run on any thread.
unsafe impl Send for DeviceMapping {}
// SAFETY: as above: no shared state but the address range itself.
unsafe impl Sync for DeviceMapping {}

impl Drop for DeviceMapping {
    fn drop(&mut self) {
        // SAFETY: `address` and `len` are exactly what mmap returned, and
        // the mapping is dropped once: nothing refers to it after this.
        unsafe { libc::munmap(self.address, self.len) };
    }
}

/// A part of a BAR mapped into the guest through a KVM slot.
struct MappedArea {
    offset: u64,
    len: u64,
    slot: u32,
}

/// One memory BAR as placed in the guest.
struct PlacedBar {
    index: u32,
    size: u64,
    areas: Vec<MappedArea>,
}

/// A BAR's range on the MMIO bus, for the platform to insert.
pub struct BarRange {
    pub address: u64,
    /// At least a page, so a small BAR does not share a page with another.
    pub size: u64,
    pub access: Arc<Mutex<BarAccess>>,
}

/// What a passed-through function raises interrupts with, shared by its
/// configuration space (enable) and its BAR (the MSI-X table).
type SharedMsix = Arc<Mutex<Msix>>;

fn lock(msix: &Mutex<Msix>) -> MutexGuard<'_, Msix> {
    msix.lock().unwrap_or_else(|e| e.into_inner())
}

/// Called after the guest enabled (or changed) MSI or MSI-X on the device,
/// or INTx was connected: the host IRQs now exist, e.g. to steer them
/// (`irq_affinity=on`).
pub type InterruptsChanged = Box<dyn Fn() + Send>;

/// A passed-through PCI function.
pub struct VfioPciDevice {
    id: String,
    host: HostDevice,
    /// "vendor:device", from the configuration space read at start.
    identity: String,
    device: Arc<VfioDevice>,
    config: GuestConfig,
    bars: Vec<PlacedBar>,
    msix: Option<SharedMsix>,
    msix_enabled: bool,
    msi_vectors: Vec<MsiVector>,
    /// Vectors enabled in VFIO (0: MSI off).
    msi_enabled: usize,
    /// The INTx line, if the function has a pin VFIO offers.
    intx: Option<IntxLine>,
    /// INTx is on in VFIO (its trigger and unmask eventfds set).
    intx_enabled: bool,
    mapper: Arc<dyn GuestMapper>,
    interrupts_changed: Option<InterruptsChanged>,
}

impl VfioPciDevice {
    /// Resets the function, reads its layout, places its BARs (allocated
    /// from `bars`), maps what can be mapped, and makes its interrupt
    /// vectors. Returns the device and the BAR ranges for the MMIO bus.
    pub fn new(
        id: String,
        host: HostDevice,
        device: VfioDevice,
        routing: &Arc<MsiRouting>,
        bars: &mut BarAllocator,
        mapper: Arc<dyn GuestMapper>,
    ) -> Result<(VfioPciDevice, Vec<BarRange>), String> {
        let device = Arc::new(device);
        device.reset();
        let mut config = [0xffu8; CONFIG_SIZE];
        device.region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut config, 0);
        let mut layout = HostLayout::read(&config, |i| device.get_region_size(i))?;
        // VFIO offers INTx (one interrupt) only where the kernel can mask
        // it; without that the guest sees no pin.
        let intx_offered = device
            .get_irq_info(VFIO_PCI_INTX_IRQ_INDEX)
            .is_some_and(|i| i.count == 1);
        if !intx_offered {
            layout.interrupt_pin = 0;
        }
        // INTx is on from the start, as in a function out of reset. If
        // VFIO cannot enable it (its host IRQ is shared with a device that
        // cannot mask INTx, say), the guest sees no pin rather than a dead
        // one.
        let intx = match layout.interrupt_pin {
            0 => None,
            _ => {
                let line = routing.new_intx_line().map_err(|e| format!("INTx: {e}"))?;
                match enable_intx(&device, &line) {
                    Ok(()) => Some(line),
                    Err(e) => {
                        tracing::warn!(
                            "{}: INTx not offered: VFIO cannot enable it: {e}",
                            host.address
                        );
                        layout.interrupt_pin = 0;
                        None
                    }
                }
            }
        };
        let identity = format!(
            "{:04x}:{:04x}",
            u16::from_le_bytes([config[0], config[1]]),
            u16::from_le_bytes([config[2], config[3]])
        );
        let mut addresses = Vec::new();
        for bar in &layout.bars {
            let address = bars.allocate(bar.size.max(PAGE_SIZE)).ok_or_else(|| {
                format!(
                    "BAR {} ({} KiB) does not fit in the PCI memory window",
                    bar.index,
                    bar.size >> 10
                )
            })?;
            addresses.push(address);
        }
        let mut placed = Vec::new();
        let mut ranges = Vec::new();
        let msix = match layout.msix {
            Some(m) => {
                let available = device
                    .get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX)
                    .map_or(0, |i| i.count);
                if u32::from(m.vectors) > available {
                    return Err(format!(
                        "its MSI-X capability has {} vectors, VFIO offers {available}",
                        m.vectors
                    ));
                }
                Some(Arc::new(Mutex::new(
                    Msix::new(routing, m.vectors).map_err(|e| format!("MSI-X: {e}"))?,
                )))
            }
            None => None,
        };
        let msi_vectors = match layout.msi {
            Some(m) if device.get_irq_info(VFIO_PCI_MSI_IRQ_INDEX).is_some() => (0..1u32
                << m.max_vectors_log2)
                .map(|_| routing.new_vector())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("MSI: {e}"))?,
            _ => Vec::new(),
        };
        for (bar, &address) in layout.bars.iter().zip(&addresses) {
            let areas = map_bar(&device, &layout, bar.index, bar.size, address, &*mapper)?;
            placed.push(PlacedBar {
                index: bar.index,
                size: bar.size,
                areas,
            });
            let trapped = |which: u32, start: u64, len: u64| {
                (which == bar.index).then_some((start, start + len))
            };
            let access = BarAccess {
                device: device.clone(),
                index: bar.index,
                msix: msix.clone(),
                table: layout
                    .msix
                    .and_then(|m| trapped(m.table_bar, m.table_offset, m.table_size())),
                pba: layout
                    .msix
                    .and_then(|m| trapped(m.pba_bar, m.pba_offset, m.pba_size())),
            };
            ranges.push(BarRange {
                address,
                size: bar.size.max(PAGE_SIZE),
                access: Arc::new(Mutex::new(access)),
            });
        }
        let mut config = GuestConfig::new(layout, &addresses);
        if let Some(line) = &intx {
            config.set_interrupt_line(line.gsi as u8);
        }
        let mut function = VfioPciDevice {
            id,
            host,
            identity,
            device,
            config,
            bars: placed,
            msix,
            msix_enabled: false,
            msi_vectors,
            msi_enabled: 0,
            intx_enabled: intx.is_some(),
            intx,
            mapper,
            interrupts_changed: None,
        };
        // Connects the line (unless the command register disables INTx).
        function.intx_enter();
        Ok((function, ranges))
    }

    /// The INTx pin (1 = INTA) and the GSI of its line, if the guest has
    /// INTx: what the DSDT's `_PRT` must say for this function's slot.
    pub fn intx_route(&self) -> Option<(u8, u32)> {
        let line = self.intx.as_ref()?;
        Some((self.config.layout().interrupt_pin, line.gsi))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host function this device is.
    pub fn host(&self) -> &HostDevice {
        &self.host
    }

    /// Runs `hook` each time the guest enables or changes MSI/MSI-X, or
    /// INTx is connected; at once if INTx already is (from the start).
    pub fn on_interrupts_changed(&mut self, hook: InterruptsChanged) {
        self.interrupts_changed = Some(hook);
        if self.intx.as_ref().is_some_and(IntxLine::is_connected) {
            self.changed();
        }
    }

    /// "vendor:device" of the host function.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One line per resource, for the VM's device list: each BAR with the
    /// bytes mapped straight into the guest, and the interrupt vectors.
    pub fn resources(&self) -> Vec<String> {
        let mut out = vec![format!("host {}", self.host.address)];
        for bar in &self.bars {
            let address = self.config.bar_address(bar.index).unwrap_or(0);
            let mapped: u64 = bar.areas.iter().map(|a| a.len).sum();
            out.push(format!(
                "bar{} mmio {:#x}-{:#x} ({} KiB mapped, {} KiB trapped)",
                bar.index,
                address,
                address + bar.size - 1,
                mapped >> 10,
                (bar.size - mapped.min(bar.size)) >> 10
            ));
        }
        if let Some(m) = self.config.layout().msix {
            out.push(format!("msi-x {} vectors", m.vectors));
        }
        if let Some((pin, gsi)) = self.intx_route() {
            out.push(format!(
                "intx INT{} gsi {gsi} (IOAPIC, level, resample)",
                char::from(b'A' + pin - 1)
            ));
        }
        if !self.msi_vectors.is_empty() {
            out.push(format!("msi {} vectors", self.msi_vectors.len()));
        }
        if !self.config.layout().hidden_io_bars.is_empty() {
            out.push(format!(
                "I/O BARs {:?} not offered",
                self.config.layout().hidden_io_bars
            ));
        }
        out
    }

    /// The host function's dword `reg`, or all ones if VFIO cannot read it.
    fn host_dword(&self, reg: usize) -> u32 {
        let mut bytes = [0xffu8; 4];
        self.device
            .region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut bytes, reg as u64 * 4);
        u32::from_le_bytes(bytes)
    }

    fn changed(&self) {
        if let Some(hook) = &self.interrupts_changed {
            hook();
        }
    }

    fn msix_control(&mut self, enabled: bool, dword: u32) {
        let Some(msix) = &self.msix else { return };
        let mut table = lock(msix);
        table.write_control(dword);
        if enabled == self.msix_enabled {
            return;
        }
        let result = if enabled {
            self.device.enable_msix(table.irqfds())
        } else {
            self.device.disable_msix()
        };
        drop(table);
        match result {
            Ok(()) => {
                self.msix_enabled = enabled;
                if enabled {
                    self.changed();
                }
            }
            Err(e) => tracing::error!("{}: MSI-X enable={enabled}: {e}", self.id),
        }
    }

    fn msi(&mut self, msi: MsiConfig) {
        let count = if msi.enabled {
            usize::from(msi.vectors).min(self.msi_vectors.len())
        } else {
            0
        };
        for (i, vector) in self.msi_vectors.iter().enumerate() {
            // With several vectors the function puts the vector number in
            // the data's low bits.
            let message = (i < count).then(|| MsiMessage {
                data: (msi.message.data & !(count as u32 - 1)) | i as u32,
                ..msi.message
            });
            if let Err(e) = vector.set_message(message) {
                tracing::error!("{}: MSI vector {i}: {e}", self.id);
            }
        }
        if count == self.msi_enabled {
            return;
        }
        if self.msi_enabled > 0 {
            if let Err(e) = self.device.disable_msi() {
                tracing::error!("{}: disabling MSI: {e}", self.id);
            }
            self.msi_enabled = 0;
        }
        if count > 0 {
            let fds: Vec<&EventFd> = self.msi_vectors[..count]
                .iter()
                .map(MsiVector::irqfd)
                .collect();
            match self.device.enable_msi(fds) {
                Ok(()) => {
                    self.msi_enabled = count;
                    self.changed();
                }
                Err(e) => tracing::error!("{}: enabling MSI: {e}", self.id),
            }
        }
    }

    /// Takes down what [`IntxState`] no longer wants, before the write
    /// that changed it takes effect: the line is disconnected (deasserted)
    /// when INTx is disabled or gives way, and INTx is off in VFIO before
    /// MSI or MSI-X is enabled there.
    fn intx_leave(&mut self) {
        let wanted = self.config.intx_state();
        let Some(line) = &mut self.intx else { return };
        if wanted != IntxState::Delivered {
            if let Err(e) = line.disconnect() {
                tracing::error!("{}: disconnecting INTx from GSI {}: {e}", self.id, line.gsi);
            }
        }
        if wanted == IntxState::Off && self.intx_enabled {
            if let Err(e) = self.device.disable_irq(VFIO_PCI_INTX_IRQ_INDEX) {
                tracing::error!("{}: disabling INTx: {e}", self.id);
            }
            self.intx_enabled = false;
            // VFIO holds the eventfds no more: what they still count
            // would be a stale interrupt when INTx comes back.
            line.drain();
        }
    }

    /// Sets up what [`IntxState`] wants, after the write that changed it
    /// took effect (MSI and MSI-X are off in VFIO by then).
    fn intx_enter(&mut self) {
        let wanted = self.config.intx_state();
        let Some(line) = &mut self.intx else { return };
        if wanted != IntxState::Off && !self.intx_enabled {
            if let Err(e) = enable_intx(&self.device, line) {
                tracing::error!("{}: enabling INTx: {e}", self.id);
                return;
            }
            self.intx_enabled = true;
        }
        if wanted == IntxState::Delivered && !line.is_connected() {
            if let Err(e) = line.connect() {
                tracing::error!("{}: connecting INTx to GSI {}: {e}", self.id, line.gsi);
                return;
            }
            // Should the host INTx be masked with nothing pending for the
            // guest to EOI, this lets it go (QEMU does the same).
            if let Err(e) = self.device.unmask_irq(VFIO_PCI_INTX_IRQ_INDEX) {
                tracing::error!("{}: unmasking INTx: {e}", self.id);
            }
            self.changed();
        }
    }

    fn follow_bar(&self, bar: u32, moved: BarMove) {
        let Some(placed) = self.bars.iter().find(|b| b.index == bar) else {
            return;
        };
        for area in &placed.areas {
            if let Err(e) = self.mapper.move_to(area.slot, moved.new + area.offset) {
                tracing::error!(
                    "{}: BAR {bar} cannot follow the guest to {:#x}: {e}",
                    self.id,
                    moved.new
                );
            }
        }
    }
}

/// Turns INTx on in VFIO with `line`'s eventfds: the trigger first (VFIO
/// takes an unmask eventfd only for an INTx that is on), then the resample
/// eventfd as the unmask one; VFIO polls it as it takes it, so an EOI in
/// between is not lost. On failure INTx is left off.
fn enable_intx(device: &VfioDevice, line: &IntxLine) -> Result<(), vfio_ioctls::VfioError> {
    device
        .enable_irq(VFIO_PCI_INTX_IRQ_INDEX, vec![line.trigger()])
        .and_then(|()| device.set_irq_resample_fd(VFIO_PCI_INTX_IRQ_INDEX, vec![line.resample()]))
        .inspect_err(|_| {
            let _ = device.disable_irq(VFIO_PCI_INTX_IRQ_INDEX);
        })
}

/// Maps the mappable areas of BAR `index` (placed at `address`) into the
/// guest; an area VFIO refuses to mmap stays trapped (slower, still right).
fn map_bar(
    device: &VfioDevice,
    layout: &HostLayout,
    index: u32,
    size: u64,
    address: u64,
    mapper: &dyn GuestMapper,
) -> Result<Vec<MappedArea>, String> {
    if device.get_region_flags(index) & VFIO_REGION_INFO_FLAG_MMAP == 0 {
        return Ok(Vec::new());
    }
    let sparse = device
        .get_region_caps(index)
        .into_iter()
        .find_map(|c| match c {
            VfioRegionInfoCap::SparseMmap(s) => Some(s.areas),
            _ => None,
        });
    let areas: Vec<(u64, u64)> = match sparse {
        Some(areas) => areas.iter().map(|a| (a.offset, a.size)).collect(),
        None => vec![(0, size)],
    };
    let region_offset = device.get_region_offset(index);
    let mut mapped = Vec::new();
    for (offset, len) in mappable_areas(size, &areas, &layout.trapped(index), PAGE_SIZE) {
        let Ok(file_offset) = libc::off_t::try_from(region_offset + offset) else {
            continue;
        };
        // SAFETY: a fresh shared mapping of the device's region at a
        // kernel-chosen address: it replaces nothing of ours.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.as_raw_fd(),
                file_offset,
            )
        };
        if host == libc::MAP_FAILED {
            tracing::warn!(
                "BAR {index}: VFIO refused to map {len:#x} bytes at {offset:#x} ({}); trapping them",
                std::io::Error::last_os_error()
            );
            continue;
        }
        let mapping = Arc::new(DeviceMapping {
            address: host,
            len: len as usize,
        });
        // SAFETY: `mapping` owns the `len` bytes at `host` and the slot
        // keeps it; the guest range lies inside this BAR's own allocation
        // in the PCI window, which nothing else uses.
        let slot = unsafe { mapper.map(host.cast(), len as usize, address + offset, mapping)? };
        mapped.push(MappedArea { offset, len, slot });
    }
    Ok(mapped)
}

impl PciDevice for VfioPciDevice {
    fn read_config(&mut self, reg: usize) -> u32 {
        if reg >= CONFIG_SIZE / 4 {
            return 0xffff_ffff;
        }
        let host = if self.config.emulates(reg) {
            0
        } else {
            self.host_dword(reg)
        };
        self.config.read(reg, host)
    }

    fn write_config(&mut self, reg: usize, value: u32, mask: u32) -> Option<BarMove> {
        if reg >= CONFIG_SIZE / 4 || mask == 0 {
            return None;
        }
        let host = if self.config.emulates(reg) {
            0
        } else {
            self.host_dword(reg)
        };
        let effect = self.config.write(reg, value, mask, host);
        self.intx_leave();
        let moved = match effect {
            ConfigWrite::Device => {
                // The bytes the mask selects: a contiguous run of lanes.
                let first = (mask.trailing_zeros() / 8) as usize;
                let last = (31 - mask.leading_zeros()) as usize / 8;
                let bytes = value.to_le_bytes();
                self.device.region_write(
                    VFIO_PCI_CONFIG_REGION_INDEX,
                    &bytes[first..=last],
                    (reg * 4 + first) as u64,
                );
                None
            }
            ConfigWrite::Absorbed => None,
            ConfigWrite::BarMoved { bar, moved } => {
                self.follow_bar(bar, moved);
                Some(moved)
            }
            ConfigWrite::MsixControl { enabled, dword, .. } => {
                self.msix_control(enabled, dword);
                None
            }
            ConfigWrite::Msi(msi) => {
                self.msi(msi);
                None
            }
        };
        self.intx_enter();
        moved
    }
}

impl Drop for VfioPciDevice {
    fn drop(&mut self) {
        if self.msix_enabled {
            let _ = self.device.disable_msix();
        }
        if self.msi_enabled > 0 {
            let _ = self.device.disable_msi();
        }
        if self.intx_enabled {
            let _ = self.device.disable_irq(VFIO_PCI_INTX_IRQ_INDEX);
        }
        // Leave the function as we found it for the next user.
        self.device.reset();
    }
}

/// The guest's accesses to the trapped parts of one BAR: the MSI-X table
/// and PBA are ours, the rest goes to the function through VFIO.
pub struct BarAccess {
    device: Arc<VfioDevice>,
    index: u32,
    msix: Option<SharedMsix>,
    /// [start, end) of the MSI-X table and PBA in this BAR, if here.
    table: Option<(u64, u64)>,
    pba: Option<(u64, u64)>,
}

fn inside(range: Option<(u64, u64)>, offset: u64) -> Option<u64> {
    range.and_then(|(start, end)| (offset >= start && offset < end).then(|| offset - start))
}

impl BusDevice for BarAccess {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let Some(msix) = &self.msix {
            if let Some(at) = inside(self.table, offset) {
                return lock(msix).read_table(at, data);
            }
            if let Some(at) = inside(self.pba, offset) {
                return lock(msix).read_pba(at, data);
            }
        }
        data.fill(0xff);
        self.device.region_read(self.index, data, offset);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(msix) = &self.msix {
            if let Some(at) = inside(self.table, offset) {
                return lock(msix).write_table(at, data);
            }
            if inside(self.pba, offset).is_some() {
                return; // read-only
            }
        }
        self.device.region_write(self.index, data, offset);
    }
}

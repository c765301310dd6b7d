//! Entry point for the fuzz target in `fuzz/` (not an API): a driver's
//! accesses to a virtio-pci function — its BAR (common configuration,
//! ISR, device configuration, notifications, MSI-X table and PBA) and its
//! PCI configuration space — in any order, at any offset and size, with
//! snapshots of the function in between, against a real rng or balloon
//! device over a small guest memory.
//!
//! The transport registers ioeventfds and MSI routes, so it needs a KVM
//! VM ([`Host`]); one VM serves a number of functions (each at its own
//! BAR, since a VM keeps the ioeventfds of a dropped function) before the
//! next replaces it: creating a VM costs milliseconds.

use std::sync::Arc;

use kvm_ioctls::{Kvm, VmFd};

use super::{VirtioPciDevice, VirtioPciError, VirtioPciState, BAR_SIZE, COMMON_FIELDS, NOTIFY};
use crate::bus::BusDevice;
use crate::interrupt::MsiRouting;
use crate::pci::{PciDevice, PCI_MMIO_START};
use crate::virtio::balloon::{Balloon, BalloonConfig};
use crate::virtio::fuzzing::{guest_memory, Input, REGION1_END};
use crate::virtio::rng::{Rng, RngConfig};
use crate::virtio::VirtioDevice;
use crate::GuestMemoryMmap;

/// Functions one VM serves before it is replaced.
const FUNCTIONS_PER_VM: u64 = 64;
/// Accesses one input makes at most.
const MAX_OPS: usize = 512;
/// Restores one input makes at most (each a new function: the VM's 64
/// must hold a whole input).
const MAX_RESTORES: usize = 8;
/// Op 6 with this bit: restore rather than snapshot.
pub const RESTORE: u8 = 8;

/// Input byte 0: the device is a balloon (else an rng).
pub const BALLOON: u8 = 1;
/// Input byte 0: the balloon has a statistics queue.
pub const BALLOON_STATS: u8 = 2;
/// Input byte 0: the balloon offers DEFLATE_ON_OOM.
pub const BALLOON_DEFLATE_ON_OOM: u8 = 4;

/// Where each region an op's bits 3-5 pick starts in the BAR (6 and 7:
/// anywhere, a 16-bit offset).
pub const REGIONS: [u64; 6] = [0x0000, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000];

/// The dword of configuration space that holds the MSI-X capability's
/// control word: after the four virtio capabilities (16, 16, 16 and 20
/// bytes from 0x40).
pub const MSIX_CAP_DWORD: u8 = 0x84 / 4;

/// A KVM VM with an in-kernel irqchip, for the transport's ioeventfds
/// and MSI routes.
pub struct Host {
    vm: Arc<VmFd>,
    routing: Arc<MsiRouting>,
    functions: u64,
}

impl Host {
    pub fn new() -> Result<Host, kvm_ioctls::Error> {
        let vm = Arc::new(Kvm::new()?.create_vm()?);
        vm.create_irq_chip()?;
        Ok(Host {
            routing: MsiRouting::new(vm.clone()),
            vm,
            functions: 0,
        })
    }

    /// A new function wrapping `device` over `memory` at a BAR no other
    /// function of this VM had; `None` when the VM is used up (or the
    /// guest moved an earlier function's BAR onto this one).
    fn function(
        &mut self,
        device: Box<dyn VirtioDevice>,
        memory: GuestMemoryMmap,
    ) -> Option<Result<VirtioPciDevice, VirtioPciError>> {
        if self.functions >= FUNCTIONS_PER_VM {
            return None;
        }
        let bar = PCI_MMIO_START + self.functions * BAR_SIZE;
        self.functions += 1;
        match VirtioPciDevice::new(device, self.vm.clone(), &self.routing, memory, bar) {
            Err(VirtioPciError::IoEventFd(_)) => None,
            other => Some(other),
        }
    }
}

/// The device byte 0 of the input asks for.
fn device(control: u8) -> Box<dyn VirtioDevice> {
    if control & BALLOON != 0 {
        let config = BalloonConfig {
            id: None,
            size_mib: 1,
            deflate_on_oom: control & BALLOON_DEFLATE_ON_OOM != 0,
            stats: control & BALLOON_STATS != 0,
        };
        // Only its timerfd can fail: the host's problem, not the guest's.
        Box::new(Balloon::new(config).expect("a balloon").0)
    } else {
        Box::new(Rng::new(RngConfig::default()))
    }
}

/// Restores `state`, changed as `input` says ([`mutate`]), into `fresh`,
/// a new function of the same VM; returns it, resumed, if it took the
/// state. The state keeps its BAR where `fresh`'s is (a snapshot is
/// restored into a VMM that places the function where it was) unless a
/// change moves it.
///
/// Panics if a function that took the state does not resume, or cannot
/// save it again; and if it took the state unchanged but saves another
/// (but for the BAR's address, which is its own).
fn restore_mutated(
    mut fresh: VirtioPciDevice,
    mut state: VirtioPciState,
    input: &mut Input,
) -> Option<VirtioPciDevice> {
    state.bar_address = fresh.bar_address;
    let changes = mutate(&mut state, input);
    fresh.restore_state(&state).ok()?;
    let again = fresh
        .save_state()
        .unwrap_or_else(|e| panic!("a restored function cannot save its state: {e}"));
    if changes == 0 {
        let same_but_bar = |s: &VirtioPciState| {
            let mut s = s.clone();
            s.config_space[BAR_DWORDS].fill(0);
            s
        };
        assert_eq!(
            same_but_bar(&again),
            same_but_bar(&state),
            "a function restored from a state saves another"
        );
    }
    fresh
        .resume()
        .unwrap_or_else(|e| panic!("a restored function does not resume: {e}"));
    Some(fresh)
}

/// Configuration space's BAR registers (dwords 4 to 9).
const BAR_DWORDS: std::ops::RangeInclusive<usize> = 4..=9;

/// Changes `state` as `input` says: a count (mod 8), then that many
/// changes, each a selector byte (mod 20), an index byte and a u64 value
/// (cut to the field). Returns the count.
///
/// Selectors: 0 a configuration dword, 1 configuration space cut to
/// `index` dwords, 2 the BAR address, 3 the status, 4 and 5 the feature
/// selectors, 6 the driver's features, 7 the queue selector, 8 the
/// configuration generation, 9 the configuration vector, 10 the ISR, 11
/// activated (bit 0), 12 a queue added (bit 0) or removed, 13-17 a
/// queue's (`index` mod their number) size, ready flag, ring addresses
/// (`index` bits 4-5: descriptors, driver, device), vector, positions
/// (next available, next used: the low and high 16 bits), 18 an MSI-X
/// entry's field (`index` bits 4-5: address low, high, data, control), 19
/// an MSI-X pending bit, or the table cut (value bit 1).
fn mutate(state: &mut VirtioPciState, input: &mut Input) -> u8 {
    let count = input.u8() % 8;
    for _ in 0..count {
        let selector = input.u8() % 20;
        let index = usize::from(input.u8());
        let value = input.u64();
        let (v16, v32) = (value as u16, value as u32);
        let pick = |len: usize| (len > 0).then(|| index % len);
        match selector {
            0 => {
                if let Some(i) = pick(state.config_space.len()) {
                    state.config_space[i] = v32;
                }
            }
            1 => state.config_space.truncate(index),
            2 => state.bar_address = value,
            3 => state.status = value as u8,
            4 => state.device_feature_select = v32,
            5 => state.driver_feature_select = v32,
            6 => state.driver_features = value,
            7 => state.queue_select = v16,
            8 => state.config_generation = value as u8,
            9 => state.config_vector = v16,
            10 => state.isr = v16,
            11 => state.activated = value & 1 != 0,
            12 => {
                if value & 1 != 0 {
                    let copy = state.queues.last().cloned();
                    state.queues.extend(copy);
                } else {
                    state.queues.pop();
                }
            }
            13..=17 => {
                let Some(i) = pick(state.queues.len()) else {
                    continue;
                };
                let q = &mut state.queues[i];
                match selector {
                    13 => q.size = v16,
                    14 => q.ready = value & 1 != 0,
                    15 => match (index >> 4) % 3 {
                        0 => q.desc = value,
                        1 => q.driver = value,
                        _ => q.device = value,
                    },
                    16 => q.vector = v16,
                    _ => {
                        q.next_avail = v16;
                        q.next_used = (value >> 16) as u16;
                    }
                }
            }
            18 => {
                let Some(i) = pick(state.msix.entries.len()) else {
                    continue;
                };
                let e = &mut state.msix.entries[i];
                match (index >> 4) & 3 {
                    0 => e.address_lo = v32,
                    1 => e.address_hi = v32,
                    2 => e.data = v32,
                    _ => e.control = v32,
                }
            }
            _ => {
                if value & 2 != 0 {
                    state.msix.entries.truncate(index);
                } else if let Some(i) = pick(state.msix.pending.len()) {
                    state.msix.pending[i] = value & 1 != 0;
                }
            }
        }
    }
    count
}

/// The BAR offset and access size of a BAR op (see [`accesses`]).
fn bar_access(op: u8, input: &mut Input) -> (u64, usize) {
    let offset = match usize::from((op >> 3) & 7) {
        r @ 0..=5 => REGIONS[r] + u64::from(input.u8()),
        _ => u64::from(input.u16()) % BAR_SIZE,
    };
    let size = input.u8();
    let len = if size & 4 == 0 {
        1 << (size & 3)
    } else {
        1 + usize::from(size >> 3) % 8
    };
    (offset, len)
}

/// Runs `input`'s accesses against a new function of `host`'s VM.
/// Layout: byte 0 picks the device ([`BALLOON`], [`BALLOON_STATS`],
/// [`BALLOON_DEFLATE_ON_OOM`]); then ops, each a byte whose bits 0-2 say
/// what, followed by its operands:
/// - 0, 1: write, read the BAR: bits 3-5 pick the region ([`REGIONS`]),
///   then a byte of offset in it (6, 7: a u16 offset in the BAR); a size
///   byte: 1, 2, 4 or 8 bytes (bits 0-1), or with bit 2 1 to 8 bytes
///   (bits 3-5); for a write, 8 bytes of value (little-endian, cut);
/// - 2, 3: write, read configuration space: a dword index (mod 64); for
///   a write a byte (bits 0-1: 1, 2 or 4 bytes, bits 2-3: at which byte)
///   and 4 bytes of value;
/// - 4: write guest memory: a u16 address (below 64 KiB), a length byte
///   and that many bytes;
/// - 5: write a common configuration field whole: a field index (mod 19)
///   and 8 bytes of value;
/// - 6: snapshot: the function's state is taken (its device brought to
///   rest) and it resumes; with [`RESTORE`] (bit 3; at most
///   [`MAX_RESTORES`] times) the state, changed as the input says
///   ([`mutate`]), is restored into a new function, which the driver
///   then uses (the old one resumes if the new one refused it);
/// - 7: notify queue (a byte, mod 4) by an MMIO write.
///
/// At the end the driver resets the device. Panics if the function
/// misreports its number of queues or is not reset by a status of 0, or
/// as [`restore_mutated`] says.
/// Returns how many restores the new function took, or `None` when
/// `host`'s VM is used up: the caller starts a new one and tries again.
pub fn accesses(host: &mut Host, input: &[u8]) -> Option<Result<usize, VirtioPciError>> {
    let mut input = Input(input);
    let control = input.u8();
    let device = device(control);
    let queue_count = device.queue_max_sizes().len() as u64;
    let mem = guest_memory();
    let mut pci = match host.function(device, mem.clone())? {
        Ok(pci) => pci,
        Err(e) => return Some(Err(e)),
    };
    let (mut restores, mut restored) = (0, 0);
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        let op = input.u8();
        match op & 7 {
            0 => {
                let (offset, len) = bar_access(op, &mut input);
                let value = input.u64().to_le_bytes();
                pci.write(offset, &value[..len]);
            }
            1 => {
                let (offset, len) = bar_access(op, &mut input);
                let mut data = [0u8; 8];
                pci.read(offset, &mut data[..len]);
                if offset == 0x12 && len == 2 {
                    assert_eq!(
                        u64::from(u16::from_le_bytes([data[0], data[1]])),
                        queue_count
                    );
                }
            }
            2 => {
                let reg = usize::from(input.u8() % 64);
                let lanes = input.u8();
                let (mask, shift) = match lanes & 3 {
                    0 => (0xff, 8 * u32::from((lanes >> 2) & 3)),
                    1 => (0xffff, 16 * u32::from((lanes >> 2) & 1)),
                    _ => (0xffff_ffff, 0),
                };
                let value = input.u32();
                pci.write_config(reg, value << shift, mask << shift);
            }
            3 => {
                pci.read_config(usize::from(input.u8() % 64));
            }
            4 => {
                let addr = u64::from(input.u16());
                let len = usize::from(input.u8());
                let bytes = input.bytes(len);
                let n = bytes.len().min((REGION1_END - addr) as usize);
                let _ =
                    vm_memory::Bytes::write_slice(&mem, &bytes[..n], vm_memory::GuestAddress(addr));
            }
            5 => {
                let (offset, width) = COMMON_FIELDS[usize::from(input.u8()) % COMMON_FIELDS.len()];
                let value = input.u64().to_le_bytes();
                pci.write(offset, &value[..width as usize]);
            }
            6 if op & RESTORE != 0 && restores < MAX_RESTORES => {
                restores += 1;
                let Ok(state) = pci.save_state() else {
                    continue;
                };
                // The same guest memory, as a restored VM has its RAM.
                let fresh = match host.function(self::device(control), mem.clone())? {
                    Ok(fresh) => fresh,
                    Err(e) => return Some(Err(e)),
                };
                match restore_mutated(fresh, state, &mut input) {
                    Some(function) => {
                        pci = function;
                        restored += 1;
                    }
                    None => {
                        let _ = pci.resume();
                    }
                }
            }
            6 => {
                // A device that cannot be brought to rest says so; it
                // must not panic.
                if pci.save_state().is_ok() {
                    let _ = pci.resume();
                }
            }
            _ => {
                let queue = u64::from(input.u8() % 4);
                pci.write(NOTIFY + 4 * queue, &[0, 0]);
            }
        }
    }
    pci.write(0x14, &[0]);
    let mut status = [0xffu8];
    pci.read(0x14, &mut status);
    assert_eq!(status[0], 0, "the device is not reset");
    Some(Ok(restored))
}

/// Writes [`accesses`] input, for seeds and tests.
pub struct Ops(pub Vec<u8>);

impl Ops {
    /// Inputs for the device byte 0 `control` says.
    pub fn new(control: u8) -> Ops {
        Ops(vec![control])
    }

    /// Writes `len` bytes of `value` to the BAR at `offset`.
    pub fn write(mut self, offset: u64, len: usize, value: u64) -> Ops {
        let size = match len {
            1 => 0,
            2 => 1,
            4 => 2,
            8 => 3,
            n => 4 | (((n - 1) as u8) << 3),
        };
        self.0.extend_from_slice(&[6 << 3]);
        self.0.extend_from_slice(&(offset as u16).to_le_bytes());
        self.0.push(size);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Reads `len` (1, 2, 4 or 8) bytes of the BAR at `offset`.
    pub fn read(mut self, offset: u64, len: usize) -> Ops {
        self.0.push(1 | (6 << 3));
        self.0.extend_from_slice(&(offset as u16).to_le_bytes());
        self.0.push(len.trailing_zeros() as u8);
        self
    }

    /// Writes the common configuration field at `offset` whole.
    pub fn common(mut self, offset: u64, value: u64) -> Ops {
        let index = COMMON_FIELDS
            .iter()
            .position(|&(o, _)| o == offset)
            .expect("a common configuration field");
        self.0.extend_from_slice(&[5, index as u8]);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Writes the dword `reg` of configuration space.
    pub fn config(mut self, reg: u8, value: u32) -> Ops {
        self.0.extend_from_slice(&[2, reg, 2]);
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Writes `bytes` (at most 255) into guest memory at `addr`.
    pub fn memory(mut self, addr: u16, bytes: &[u8]) -> Ops {
        self.0.push(4);
        self.0.extend_from_slice(&addr.to_le_bytes());
        self.0.push(bytes.len() as u8);
        self.0.extend_from_slice(bytes);
        self
    }

    pub fn snapshot(mut self) -> Ops {
        self.0.push(6);
        self
    }

    /// Restores the function's state into a new one, with `changes`
    /// (selector, index, value; see [`mutate`]).
    pub fn restore(mut self, changes: &[(u8, u8, u64)]) -> Ops {
        self.0
            .extend_from_slice(&[6 | RESTORE, changes.len() as u8]);
        for &(selector, index, value) in changes {
            self.0.extend_from_slice(&[selector, index]);
            self.0.extend_from_slice(&value.to_le_bytes());
        }
        self
    }

    pub fn notify(mut self, queue: u8) -> Ops {
        self.0.extend_from_slice(&[7, queue]);
        self
    }

    /// A driver's initialization as Linux does it: reset, ACKNOWLEDGE,
    /// DRIVER, the device's features read and VERSION_1 (with `features`,
    /// the low 32 bits) accepted, FEATURES_OK, MSI-X enabled with a
    /// message for each of `queues` queue vectors and the configuration
    /// vector, each queue set up at [`Ops::ring`]`(n)` with `size`
    /// entries, then DRIVER_OK.
    pub fn driver_init(self, queues: u16, size: u16, features: u32) -> Ops {
        let mut ops = self
            .common(0x14, 0)
            .common(0x14, 1)
            .common(0x14, 3)
            .common(0x00, 0)
            .read(0x04, 4)
            .common(0x00, 1)
            .read(0x04, 4)
            .common(0x08, 0)
            .common(0x0c, u64::from(features))
            .common(0x08, 1)
            .common(0x0c, 1)
            .common(0x14, 0xb)
            .read(0x14, 1)
            // Memory space and bus mastering; MSI-X enabled.
            .config(1, 0x6)
            .config(u32::from(MSIX_CAP_DWORD) as u8, 1 << 31);
        for vector in 0..=u64::from(queues) {
            ops = ops
                .write(0x4000 + 16 * vector, 4, 0xfee0_0000)
                .write(0x4004 + 16 * vector, 4, 0)
                .write(0x4008 + 16 * vector, 4, 0x30 + vector)
                .write(0x400c + 16 * vector, 4, 0);
        }
        ops = ops.common(0x10, 0).read(0x12, 2);
        for q in 0..queues {
            let (desc, avail, used) = Ops::ring(q);
            ops = ops
                .common(0x16, u64::from(q))
                .read(0x18, 2)
                .common(0x18, u64::from(size))
                .common(0x1a, u64::from(q) + 1)
                .common(0x20, desc)
                .common(0x24, 0)
                .common(0x28, avail)
                .common(0x2c, 0)
                .common(0x30, used)
                .common(0x34, 0)
                .common(0x1c, 1);
        }
        ops.common(0x14, 0xf)
    }

    /// Where [`Ops::driver_init`] puts queue `n`: descriptor table,
    /// available ring, used ring.
    pub fn ring(n: u16) -> (u64, u64, u64) {
        let base = 0x400 * u64::from(n);
        (base, base + 0x100, base + 0x200)
    }

    /// Offers a chain of one descriptor (`addr`, `len`, `flags`) as
    /// entry `slot` of queue `queue`'s rings (set up by
    /// [`Ops::driver_init`]), the available index then `slot + 1`, and
    /// kicks the queue.
    pub fn offer(self, queue: u16, slot: u16, addr: u64, len: u32, flags: u16) -> Ops {
        let (desc, avail, _) = Ops::ring(queue);
        let mut d = addr.to_le_bytes().to_vec();
        d.extend_from_slice(&len.to_le_bytes());
        d.extend_from_slice(&flags.to_le_bytes());
        d.extend_from_slice(&0u16.to_le_bytes());
        self.memory((desc + 16 * u64::from(slot)) as u16, &d)
            .memory(
                (avail + 4 + 2 * u64::from(slot)) as u16,
                &slot.to_le_bytes(),
            )
            .memory((avail + 2) as u16, &(slot + 1).to_le_bytes())
            .notify(queue as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_sets_the_device_up_and_resets_it() {
        // The transport needs KVM; without it there is nothing to test.
        let Ok(mut host) = Host::new() else {
            eprintln!("no KVM: skipped");
            return;
        };
        let rng = Ops::new(0)
            .driver_init(1, 16, 0)
            .offer(0, 0, 0x1000, 64, 2)
            .snapshot()
            .offer(0, 1, 0x2_0000, 0x4000, 2)
            .read(0x1000, 1);
        accesses(&mut host, &rng.0).unwrap().unwrap();
        let balloon = Ops::new(BALLOON | BALLOON_STATS)
            .driver_init(3, 16, 0)
            // Inflate by a page of the second region, then deflate.
            .memory(0x1000, &0x21u32.to_le_bytes())
            .offer(0, 0, 0x1000, 4, 0)
            .offer(1, 0, 0x1000, 4, 0)
            .snapshot();
        accesses(&mut host, &balloon.0).unwrap().unwrap();

        // A serving rng restored into a new function, unchanged, takes
        // its state, saves the same and serves on from where it was; one
        // whose queue has a size that is not a power of two, or whose
        // MSI-X table lost a vector, is refused and the old one serves.
        let rng = |changes: &[(u8, u8, u64)]| {
            Ops::new(0)
                .driver_init(1, 16, 0)
                .offer(0, 0, 0x1000, 64, 2)
                .restore(changes)
                .offer(0, 1, 0x1000, 64, 2)
        };
        assert_eq!(accesses(&mut host, &rng(&[]).0).unwrap().unwrap(), 1);
        assert_eq!(
            accesses(&mut host, &rng(&[(13, 0, 3)]).0).unwrap().unwrap(),
            0
        );
        assert_eq!(
            accesses(&mut host, &rng(&[(19, 0, 2)]).0).unwrap().unwrap(),
            0
        );
        // A state moved to another BAR is taken too.
        let moved = PCI_MMIO_START + 63 * BAR_SIZE;
        assert_eq!(
            accesses(&mut host, &rng(&[(2, 0, moved)]).0)
                .unwrap()
                .unwrap(),
            1
        );

        // The MSI-X capability is where the seeds expect it.
        let pci = host.function(device(0), guest_memory()).unwrap().unwrap();
        assert_eq!(pci.msix_cap_dword, usize::from(MSIX_CAP_DWORD));
    }
}

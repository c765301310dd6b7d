//! What the kernel is told at entry: the e820 memory map, and either the
//! Linux zero page (`struct boot_params`) or the PVH `hvm_start_info`.

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{linux::LinuxBootConfigurator, BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, screen_info, setup_header};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{GuestAddress, GuestMemoryBackend};

use crate::layout::{
    low_ram_end, EBDA_START, HIMEM_START, MMIO_HOLE_END, MMIO_HOLE_START, PVH_INFO_START,
    PVH_MEMMAP_START, PVH_MODLIST_START, ZERO_PAGE_START,
};
use crate::Error;

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type of reserved memory.
pub const E820_RESERVED: u32 = 2;

/// One entry of the memory map handed to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryMapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// The guest's memory map for `mem_size` bytes of RAM: low RAM below the
/// EBDA, the BIOS area (holding the ACPI tables) reserved, RAM from 1 MiB
/// to the MMIO hole, and the rest above 4 GiB.
pub fn memory_map(mem_size: u64) -> Vec<MemoryMapEntry> {
    let mut map = vec![
        MemoryMapEntry {
            addr: 0,
            size: EBDA_START,
            kind: E820_RAM,
        },
        MemoryMapEntry {
            addr: EBDA_START,
            size: HIMEM_START - EBDA_START,
            kind: E820_RESERVED,
        },
        MemoryMapEntry {
            addr: HIMEM_START,
            size: low_ram_end(mem_size) - HIMEM_START,
            kind: E820_RAM,
        },
    ];
    if mem_size > MMIO_HOLE_START {
        map.push(MemoryMapEntry {
            addr: MMIO_HOLE_END,
            size: mem_size - MMIO_HOLE_START,
            kind: E820_RAM,
        });
    }
    map
}

/// Where the command line and initramfs are in guest memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct BootInputs {
    pub cmdline_addr: u64,
    /// Length of the command line without its NUL.
    pub cmdline_len: usize,
    /// (address, size) of the initramfs, if any.
    pub initramfs: Option<(u64, u64)>,
    pub rsdp_addr: u64,
    pub mem_size: u64,
    /// A linear framebuffer to describe in `screen_info`, if any.
    pub framebuffer: Option<LinearFramebuffer>,
}

/// A 32 bpp XRGB framebuffer the guest finds through `screen_info`, the
/// way a BIOS reports a VESA linear framebuffer: the stock kernel's vesafb
/// drives it (/dev/fb0, fbcon) with no driver of ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearFramebuffer {
    pub address: u64,
    pub width: u16,
    pub height: u16,
    /// Bytes per row.
    pub stride: u32,
    /// Bytes of framebuffer memory.
    pub size: u64,
}

/// `screen_info.orig_video_isVGA` for a VESA linear framebuffer.
const VIDEO_TYPE_VLFB: u8 = 0x23;
/// `screen_info.capabilities` bit 1: the kernel reads it as "ext_lfb_base
/// holds address bits 32..63" and vesafb as the VBE "not VGA compatible"
/// bit. Both are what we mean: no VGA registers to program, and a base that
/// is whole (ext_lfb_base is 0 below 4 GiB).
const VIDEO_CAPABILITY_64BIT_BASE_NOT_VGA: u32 = 1 << 1;

/// Fills `screen_info` for `fb`.
fn describe_framebuffer(info: &mut screen_info, fb: &LinearFramebuffer) {
    info.orig_video_isVGA = VIDEO_TYPE_VLFB;
    info.lfb_width = fb.width;
    info.lfb_height = fb.height;
    info.lfb_depth = 32;
    info.lfb_linelength = fb.stride as u16;
    info.lfb_base = fb.address as u32;
    info.ext_lfb_base = (fb.address >> 32) as u32;
    // vesafb reads the size in 64 KiB units.
    info.lfb_size = fb.size.div_ceil(64 << 10) as u32;
    (info.red_size, info.red_pos) = (8, 16);
    (info.green_size, info.green_pos) = (8, 8);
    (info.blue_size, info.blue_pos) = (8, 0);
    (info.rsvd_size, info.rsvd_pos) = (8, 24);
    info.capabilities = VIDEO_CAPABILITY_64BIT_BASE_NOT_VGA;
}

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x0100_0000;

/// Writes the Linux zero page. `header` is the bzImage's own setup header;
/// an ELF vmlinux has none, so a minimal one is made up.
pub fn write_zero_page<M: GuestMemoryBackend>(
    mem: &M,
    header: Option<setup_header>,
    inputs: &BootInputs,
) -> Result<u64, Error> {
    let mut params = boot_params {
        hdr: header.unwrap_or(setup_header {
            boot_flag: KERNEL_BOOT_FLAG_MAGIC,
            header: KERNEL_HDR_MAGIC,
            kernel_alignment: KERNEL_MIN_ALIGNMENT_BYTES,
            ..Default::default()
        }),
        ..Default::default()
    };
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.cmd_line_ptr = inputs.cmdline_addr as u32;
    params.hdr.cmdline_size = inputs.cmdline_len as u32;
    if let Some((addr, size)) = inputs.initramfs {
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = size as u32;
    }
    params.acpi_rsdp_addr = inputs.rsdp_addr;
    if let Some(fb) = &inputs.framebuffer {
        describe_framebuffer(&mut params.screen_info, fb);
    }

    let map = memory_map(inputs.mem_size);
    if map.len() > params.e820_table.len() {
        return Err(Error::BootStructure("e820 table"));
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(&map) {
        *slot = boot_e820_entry {
            addr: entry.addr,
            size: entry.size,
            r#type: entry.kind,
        };
    }
    params.e820_entries = map.len() as u8;

    LinuxBootConfigurator::write_bootparams::<M>(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE_START)),
        mem,
    )
    .map_err(|_| Error::BootStructure("zero page"))?;
    Ok(ZERO_PAGE_START)
}

const XEN_HVM_START_MAGIC_VALUE: u32 = 0x336e_c578;

/// Writes the PVH `hvm_start_info`, its memory map and module list.
pub fn write_pvh_start_info<M: GuestMemoryBackend>(
    mem: &M,
    inputs: &BootInputs,
) -> Result<u64, Error> {
    let map: Vec<hvm_memmap_table_entry> = memory_map(inputs.mem_size)
        .iter()
        .map(|e| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
            reserved: 0,
        })
        .collect();
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        cmdline_paddr: inputs.cmdline_addr,
        rsdp_paddr: inputs.rsdp_addr,
        memmap_paddr: PVH_MEMMAP_START,
        memmap_entries: map.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&info, GuestAddress(PVH_INFO_START));
    params.set_sections(&map, GuestAddress(PVH_MEMMAP_START));
    if let Some((paddr, size)) = inputs.initramfs {
        info.nr_modules = 1;
        info.modlist_paddr = PVH_MODLIST_START;
        params = BootParams::new(&info, GuestAddress(PVH_INFO_START));
        params.set_sections(&map, GuestAddress(PVH_MEMMAP_START));
        let module = hvm_modlist_entry {
            paddr,
            size,
            ..Default::default()
        };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_START));
    }
    PvhBootConfigurator::write_bootparams::<M>(&params, mem)
        .map_err(|_| Error::BootStructure("PVH start info"))?;
    Ok(PVH_INFO_START)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    #[test]
    fn memory_map_accounts_for_all_ram() {
        for mem in [256u64 << 20, 3 << 30, 6 << 30] {
            let ram: u64 = memory_map(mem)
                .iter()
                .filter(|e| e.kind == E820_RAM)
                .map(|e| e.size)
                .sum();
            // Everything but the BIOS area (EBDA..1 MiB) is usable RAM.
            assert_eq!(ram, mem - (HIMEM_START - EBDA_START), "mem {mem:#x}");
        }
        let big = memory_map(6 << 30);
        assert_eq!(big.last().unwrap().addr, MMIO_HOLE_END);
    }

    #[test]
    fn zero_page_carries_cmdline_initramfs_and_e820() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let inputs = BootInputs {
            cmdline_addr: 0x20000,
            cmdline_len: 12,
            initramfs: Some((0x0800_0000, 0x1234)),
            rsdp_addr: 0xe0000,
            mem_size: 512 << 20,
            framebuffer: None,
        };
        let addr = write_zero_page(&mem, None, &inputs).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(addr)).unwrap();
        assert_eq!({ params.hdr.cmd_line_ptr }, 0x20000);
        assert_eq!({ params.hdr.ramdisk_image }, 0x0800_0000);
        assert_eq!({ params.hdr.ramdisk_size }, 0x1234);
        assert_eq!({ params.hdr.type_of_loader }, KERNEL_LOADER_OTHER);
        assert_eq!({ params.hdr.header }, KERNEL_HDR_MAGIC);
        assert_eq!({ params.acpi_rsdp_addr }, 0xe0000);
        assert_eq!(params.e820_entries, 3);
        let last = params.e820_table[2];
        assert_eq!({ last.addr } + { last.size }, 512 << 20);
        assert_eq!(
            params.screen_info.orig_video_isVGA, 0,
            "no display, no screen"
        );
    }

    #[test]
    fn zero_page_describes_the_framebuffer_as_vesa_lfb() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let inputs = BootInputs {
            cmdline_addr: 0x20000,
            cmdline_len: 12,
            initramfs: None,
            rsdp_addr: 0xe0000,
            mem_size: 512 << 20,
            framebuffer: Some(LinearFramebuffer {
                address: 0xe000_0000,
                width: 1024,
                height: 768,
                stride: 4096,
                size: 3 << 20,
            }),
        };
        let addr = write_zero_page(&mem, None, &inputs).unwrap();
        let params: boot_params = mem.read_obj(GuestAddress(addr)).unwrap();
        let si = params.screen_info;
        assert_eq!(si.orig_video_isVGA, VIDEO_TYPE_VLFB);
        assert_eq!(
            ({ si.lfb_width }, { si.lfb_height }, { si.lfb_depth }),
            (1024, 768, 32)
        );
        assert_eq!(({ si.lfb_base }, { si.ext_lfb_base }), (0xe000_0000, 0));
        assert_eq!({ si.lfb_linelength }, 4096);
        assert_eq!({ si.lfb_size }, 48, "3 MiB in 64 KiB units");
        assert_eq!((si.red_pos, si.green_pos, si.blue_pos), (16, 8, 0));
    }

    #[test]
    fn pvh_start_info_lists_the_initramfs() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let inputs = BootInputs {
            cmdline_addr: 0x20000,
            cmdline_len: 5,
            initramfs: Some((0x0900_0000, 0x4000)),
            rsdp_addr: 0xe0000,
            mem_size: 1 << 30,
            framebuffer: None,
        };
        let addr = write_pvh_start_info(&mem, &inputs).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(addr)).unwrap();
        assert_eq!(info.magic, XEN_HVM_START_MAGIC_VALUE);
        assert_eq!(info.nr_modules, 1);
        assert_eq!(info.memmap_entries, 3);
        let module: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!((module.paddr, module.size), (0x0900_0000, 0x4000));
    }
}

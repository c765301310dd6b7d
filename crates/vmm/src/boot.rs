//! Putting the kernel, its command line and initramfs into guest memory
//! and deciding how the boot CPU enters it.
//!
//! bzImages use the Linux 64-bit boot protocol (entry at load + 0x200);
//! ELF vmlinux files use PVH when they carry the PVH note, and the 64-bit
//! protocol at their ELF entry otherwise.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use arch::bootparams::{write_pvh_start_info, write_zero_page, BootInputs, LinearFramebuffer};
use arch::layout::{low_ram_end, CMDLINE_MAX_SIZE, CMDLINE_START, HIMEM_START};
use arch::regs::EntryMode;
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::elf::PvhBootCapability;
use linux_loader::loader::{
    bzimage::BzImage, elf::Elf, load_cmdline, KernelLoader, KernelLoaderResult,
};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use crate::config::format_size;
use crate::memory::GuestMemoryMmap;
use crate::{io_reason, Error};

/// Kernel image formats hakoniwa boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    BzImage,
    Elf,
}

/// The boot protocol actually used, for `vm.info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    Linux64,
    Pvh,
}

impl BootProtocol {
    pub fn name(self) -> &'static str {
        match self {
            BootProtocol::Linux64 => "linux-64bit",
            BootProtocol::Pvh => "pvh",
        }
    }
}

/// Where the boot CPU starts and which protocol that is.
#[derive(Clone, Copy, Debug)]
pub struct BootEntry {
    pub mode: EntryMode,
    pub protocol: BootProtocol,
}

/// Offset of the 64-bit entry point from a bzImage's load address.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// The 64-bit boot protocol needs header version 2.12 and XLF_KERNEL_64.
const BOOT_PROTOCOL_64BIT_MIN_VERSION: u16 = 0x020c;
const XLF_KERNEL_64: u16 = 1 << 0;
/// Room the kernel needs beyond the bytes it is loaded into, for its page
/// tables, early allocations and unpacking the initramfs.
const KERNEL_RUNTIME_MARGIN: u64 = 32 << 20;
const PAGE_SIZE: u64 = 4096;

/// Reads the first bytes of `path` to tell a bzImage from an ELF vmlinux.
pub fn detect_kernel_format(path: &Path) -> Result<KernelFormat, Error> {
    let mut file = open(path, "kernel")?;
    let mut magic = [0u8; 4];
    let is_elf = file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF";
    if is_elf {
        return Ok(KernelFormat::Elf);
    }
    let mut hdrs = [0u8; 4];
    let is_bzimage = file.seek(SeekFrom::Start(0x202)).is_ok()
        && file.read_exact(&mut hdrs).is_ok()
        && hdrs == *b"HdrS";
    if is_bzimage {
        Ok(KernelFormat::BzImage)
    } else {
        Err(Error::NotAKernel(path.to_path_buf()))
    }
}

/// Checks the user's files before any KVM work: the kernel is a kernel
/// that can boot, the initramfs can be read, and both fit in `mem_size`
/// (for a bzImage, whose header says how much room it needs).
pub fn check_boot_files(
    kernel: &Path,
    initramfs: Option<&Path>,
    mem_size: u64,
) -> Result<(), Error> {
    let format = detect_kernel_format(kernel)?;
    let initramfs_size = match initramfs {
        Some(path) => initramfs_size(path)?,
        None => 0,
    };
    if format == KernelFormat::BzImage {
        let header = read_setup_header(kernel)?;
        check_64bit_protocol(kernel, &header)?;
        let footprint = header.pref_address.max(HIMEM_START) + u64::from(header.init_size);
        check_fits(
            mem_size,
            footprint + KERNEL_RUNTIME_MARGIN + initramfs_size.next_multiple_of(PAGE_SIZE),
        )?;
    }
    Ok(())
}

/// Size of a readable, non-empty initramfs.
fn initramfs_size(path: &Path) -> Result<u64, Error> {
    let mut file = open(path, "initramfs")?;
    let mut first = [0u8; 1];
    match file.read(&mut first) {
        Ok(0) => Err(Error::EmptyInitramfs(path.to_path_buf())),
        Ok(_) => file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| Error::ReadFile {
                what: "initramfs",
                path: path.to_path_buf(),
                reason: io_reason(&e),
            }),
        Err(e) => Err(Error::ReadFile {
            what: "initramfs",
            path: path.to_path_buf(),
            reason: io_reason(&e),
        }),
    }
}

/// Offset of the setup header in a bzImage.
const SETUP_HEADER_OFFSET: u64 = 0x1f1;

fn read_setup_header(kernel: &Path) -> Result<setup_header, Error> {
    let mut file = open(kernel, "kernel")?;
    let mut header = setup_header::default();
    file.seek(SeekFrom::Start(SETUP_HEADER_OFFSET))
        .and_then(|_| file.read_exact(header.as_mut_slice()))
        .map_err(|_| Error::NotAKernel(kernel.to_path_buf()))?;
    Ok(header)
}

fn open(path: &Path, what: &'static str) -> Result<File, Error> {
    File::open(path).map_err(|e| Error::OpenFile {
        what,
        path: path.to_path_buf(),
        error: e,
    })
}

/// Loads everything the kernel needs and returns how to enter it.
pub fn load_boot_images(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    kernel: &Path,
    initramfs: Option<&Path>,
    cmdline: &str,
    rsdp_addr: u64,
    framebuffer: Option<LinearFramebuffer>,
) -> Result<BootEntry, Error> {
    let format = detect_kernel_format(kernel)?;
    let mut kernel_file = open(kernel, "kernel")?;
    let loaded = match format {
        KernelFormat::BzImage => BzImage::load(
            mem,
            Some(GuestAddress(HIMEM_START)),
            &mut kernel_file,
            Some(GuestAddress(HIMEM_START)),
        ),
        KernelFormat::Elf => {
            Elf::load(mem, None, &mut kernel_file, Some(GuestAddress(HIMEM_START)))
        }
    }
    .map_err(|e| kernel_load_error(kernel, mem_size, e))?;

    let kernel_needs_up_to = kernel_footprint_end(&loaded);
    let initramfs = match initramfs {
        Some(path) => Some(load_initramfs(mem, mem_size, path, kernel_needs_up_to)?),
        None => {
            check_fits(mem_size, kernel_needs_up_to + KERNEL_RUNTIME_MARGIN)?;
            None
        }
    };

    let cmdline_len = write_cmdline(mem, cmdline)?;
    let inputs = BootInputs {
        cmdline_addr: CMDLINE_START,
        cmdline_len,
        initramfs,
        rsdp_addr,
        mem_size,
        framebuffer,
    };

    // PVH's start info has no screen description, so a VM with a display
    // enters an ELF kernel through its 64-bit entry and the zero page.
    let pvh = match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) if inputs.framebuffer.is_none() => Some(entry),
        _ => None,
    };
    match (format, pvh) {
        (KernelFormat::Elf, Some(entry)) => {
            let start_info = write_pvh_start_info(mem, &inputs)?;
            Ok(BootEntry {
                mode: EntryMode::Pvh {
                    entry: entry.0,
                    start_info,
                },
                protocol: BootProtocol::Pvh,
            })
        }
        (KernelFormat::Elf, _) => {
            let zero_page = write_zero_page(mem, None, &inputs)?;
            Ok(BootEntry {
                mode: EntryMode::Linux64 {
                    entry: loaded.kernel_load.0,
                    zero_page,
                },
                protocol: BootProtocol::Linux64,
            })
        }
        (KernelFormat::BzImage, _) => {
            let header = loaded
                .setup_header
                .ok_or_else(|| Error::NotAKernel(kernel.to_path_buf()))?;
            check_64bit_protocol(kernel, &header)?;
            let zero_page = write_zero_page(mem, Some(header), &inputs)?;
            Ok(BootEntry {
                mode: EntryMode::Linux64 {
                    entry: loaded.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
                    zero_page,
                },
                protocol: BootProtocol::Linux64,
            })
        }
    }
}

fn kernel_load_error(kernel: &Path, mem_size: u64, e: linux_loader::loader::Error) -> Error {
    use linux_loader::loader::Error as L;
    match e {
        // Copying the image past the end of RAM is the only way these fail
        // on a valid image.
        L::Bzimage(linux_loader::loader::bzimage::Error::ReadBzImageCompressedKernel)
        | L::Elf(linux_loader::loader::elf::Error::ReadKernelImage) => Error::MemoryTooSmall {
            given: format_size(mem_size),
            needed: None,
        },
        other => Error::BadKernel {
            path: kernel.to_path_buf(),
            reason: other.to_string(),
        },
    }
}

/// The highest guest-physical address the kernel occupies while it boots.
/// A bzImage decompresses itself to `pref_address` and needs `init_size`
/// bytes there; an ELF vmlinux needs just what it was loaded into.
fn kernel_footprint_end(loaded: &KernelLoaderResult) -> u64 {
    match loaded.setup_header {
        Some(header) => {
            let pref = header.pref_address.max(loaded.kernel_load.0);
            loaded.kernel_end.max(pref + u64::from(header.init_size))
        }
        None => loaded.kernel_end,
    }
}

fn check_64bit_protocol(kernel: &Path, header: &setup_header) -> Result<(), Error> {
    let version = header.version;
    let xloadflags = header.xloadflags;
    if version < BOOT_PROTOCOL_64BIT_MIN_VERSION || xloadflags & XLF_KERNEL_64 == 0 {
        return Err(Error::BadKernel {
            path: kernel.to_path_buf(),
            reason: format!(
                "it does not support the 64-bit boot protocol (boot protocol {}.{:02}, needs 2.12 with XLF_KERNEL_64)",
                version >> 8,
                version & 0xff
            ),
        });
    }
    Ok(())
}

fn check_fits(mem_size: u64, needed: u64) -> Result<(), Error> {
    if needed > low_ram_end(mem_size) {
        return Err(Error::MemoryTooSmall {
            given: format_size(mem_size),
            needed: Some(format_size(needed)),
        });
    }
    Ok(())
}

/// Puts the initramfs at the top of low RAM, page aligned, above the
/// kernel's footprint and margin; returns (address, size).
fn load_initramfs(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    path: &Path,
    kernel_end: u64,
) -> Result<(u64, u64), Error> {
    let mut file = open(path, "initramfs")?;
    let size = file
        .metadata()
        .map_err(|e| Error::OpenFile {
            what: "initramfs",
            path: path.to_path_buf(),
            error: e,
        })?
        .len();
    if size == 0 {
        return Err(Error::EmptyInitramfs(path.to_path_buf()));
    }
    let needed = kernel_end + KERNEL_RUNTIME_MARGIN + size.next_multiple_of(PAGE_SIZE);
    check_fits(mem_size, needed)?;
    let addr = (low_ram_end(mem_size) - size) & !(PAGE_SIZE - 1);
    mem.read_exact_volatile_from(GuestAddress(addr), &mut file, size as usize)
        .map_err(|e| Error::ReadFile {
            what: "initramfs",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok((addr, size))
}

fn write_cmdline(mem: &GuestMemoryMmap, text: &str) -> Result<usize, Error> {
    let too_long = || Error::CmdlineTooLong(text.len(), CMDLINE_MAX_SIZE - 1);
    if text.len() >= CMDLINE_MAX_SIZE {
        return Err(too_long());
    }
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(|_| too_long())?;
    if !text.is_empty() {
        cmdline
            .insert_str(text)
            .map_err(|e| Error::BadCmdline(e.to_string()))?;
    }
    load_cmdline(mem, GuestAddress(CMDLINE_START), &cmdline)
        .map_err(|e| Error::BadCmdline(e.to_string()))?;
    Ok(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("hakoniwa-boot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        path
    }

    #[test]
    fn formats_are_told_apart_by_their_magic() {
        let elf = temp_file("vmlinux", b"\x7fELF\x02\x01\x01rest");
        assert_eq!(detect_kernel_format(&elf).unwrap(), KernelFormat::Elf);
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        let bz = temp_file("bzImage", &bz);
        assert_eq!(detect_kernel_format(&bz).unwrap(), KernelFormat::BzImage);
    }

    #[test]
    fn text_and_short_files_are_not_kernels() {
        let text = temp_file("notes.txt", b"just some text, not a kernel at all\n");
        assert!(matches!(
            detect_kernel_format(&text),
            Err(Error::NotAKernel(_))
        ));
        let empty = temp_file("empty", b"");
        assert!(matches!(
            detect_kernel_format(&empty),
            Err(Error::NotAKernel(_))
        ));
    }

    #[test]
    fn a_missing_kernel_names_the_path() {
        let err = detect_kernel_format(Path::new("/nonexistent/vmlinuz")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/vmlinuz"), "{text}");
        assert!(text.contains("kernel"), "{text}");
    }

    #[test]
    fn cmdline_length_is_bounded() {
        let mem = crate::memory::create_guest_memory(64 << 20).unwrap();
        assert_eq!(write_cmdline(&mem, "console=ttyS0").unwrap(), 13);
        let long = "a".repeat(CMDLINE_MAX_SIZE);
        assert!(matches!(
            write_cmdline(&mem, &long),
            Err(Error::CmdlineTooLong(..))
        ));
    }

    #[test]
    fn initramfs_goes_to_the_top_of_low_ram() {
        let mem = crate::memory::create_guest_memory(128 << 20).unwrap();
        let path = temp_file("initrd", &[7u8; 10000]);
        let (addr, size) = load_initramfs(&mem, 128 << 20, &path, 20 << 20).unwrap();
        assert_eq!(size, 10000);
        assert_eq!(addr % PAGE_SIZE, 0);
        assert!(addr + size <= 128 << 20);
        let mut byte = [0u8];
        mem.read_slice(&mut byte, GuestAddress(addr + size - 1))
            .unwrap();
        assert_eq!(byte, [7]);
    }

    #[test]
    fn too_little_memory_for_kernel_and_initramfs_is_refused() {
        let mem = crate::memory::create_guest_memory(64 << 20).unwrap();
        let path = temp_file("big-initrd", &vec![0u8; 8 << 20]);
        let err = load_initramfs(&mem, 64 << 20, &path, 40 << 20).unwrap_err();
        assert!(matches!(err, Error::MemoryTooSmall { .. }), "{err}");
        // 40M kernel + 32M runtime margin + 8M initramfs.
        assert!(err.to_string().contains("80M"), "{err}");
        let empty = temp_file("empty-initrd", b"");
        assert!(matches!(
            load_initramfs(&mem, 64 << 20, &empty, 1 << 20),
            Err(Error::EmptyInitramfs(_))
        ));
    }
}

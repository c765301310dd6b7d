//! The snapshot file: a header, then checksummed sections.
//!
//! ```text
//! header   "HKNWSNAP" | format version u32 | hakoniwa version (u16 length + UTF-8)
//!          | CRC32 of the header bytes before it (u32)
//! section  tag [u8; 4] | payload length u64 | CRC32 of the payload u32 | payload
//!   "META"  the VmSnapshot as JSON (machine, KVM state, devices)
//!   "RAM "  guest RAM, the regions of `machine.ram_regions` back to back
//!   "END "  empty: the file is complete
//! ```
//!
//! All integers are little-endian. Opening checks everything but the RAM
//! checksum without touching KVM, and finds a truncated file by its
//! length; the RAM checksum is checked while RAM is loaded, before any vCPU
//! runs.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use vm_memory::{Bytes, GuestAddress};

use super::state::VmSnapshot;
use super::SnapshotError;
use crate::memory::GuestMemoryMmap;
use crate::private_file::PrivateFile;

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"HKNWSNAP";
/// Bumped whenever the layout or the metadata's meaning changes; a
/// snapshot of another version is refused. 2: the metadata's devices hold
/// the virtio functions.
pub const FORMAT_VERSION: u32 = 2;
/// The hakoniwa build that writes and reads snapshots.
pub const HAKONIWA_VERSION: &str = env!("CARGO_PKG_VERSION");

const TAG_META: &[u8; 4] = b"META";
const TAG_RAM: &[u8; 4] = b"RAM ";
const TAG_END: &[u8; 4] = b"END ";
const SECTION_HEADER_LEN: u64 = 4 + 8 + 4;
/// Larger metadata means a damaged length field, not a real VM.
const MAX_META_LEN: u64 = 256 << 20;
/// RAM moves through a buffer of this size.
const CHUNK: usize = 1 << 20;

/// Writes `snapshot` and `memory`'s RAM to `path`: first to `path.partial`
/// (mode 0600, never through a symbolic link: [`crate::private_file`]),
/// renamed into place once complete and synced, so `path` is never a
/// half-written snapshot.
pub fn write_snapshot(
    path: &Path,
    snapshot: &VmSnapshot,
    memory: &GuestMemoryMmap,
) -> Result<u64, SnapshotError> {
    let mut file = PrivateFile::create(path)?;
    let partial = file.partial().to_owned();
    let size = write_to(&partial, file.file_mut(), snapshot, memory)?;
    // An error above drops `file`, which removes the partial file.
    file.commit()?;
    Ok(size)
}

fn write_to(
    path: &Path,
    file: &mut File,
    snapshot: &VmSnapshot,
    memory: &GuestMemoryMmap,
) -> Result<u64, SnapshotError> {
    let io = |e| SnapshotError::io(path, e);
    let mut out = BufWriter::with_capacity(CHUNK, file);

    let mut header = Vec::new();
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&(HAKONIWA_VERSION.len() as u16).to_le_bytes());
    header.extend_from_slice(HAKONIWA_VERSION.as_bytes());
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    out.write_all(&header).map_err(io)?;

    let meta = serde_json::to_vec(snapshot)
        .map_err(|e| SnapshotError::Invalid(format!("cannot encode the VM state: {e}")))?;
    write_section_header(
        &mut out,
        TAG_META,
        meta.len() as u64,
        crc32fast::hash(&meta),
    )
    .map_err(io)?;
    out.write_all(&meta).map_err(io)?;

    // RAM: its checksum is known only at the end, so the section header is
    // written with a placeholder and patched.
    let ram_header_at = (header.len() + SECTION_HEADER_LEN as usize + meta.len()) as u64;
    let ram_len: u64 = snapshot.machine.ram_regions.iter().map(|r| r.1).sum();
    write_section_header(&mut out, TAG_RAM, ram_len, 0).map_err(io)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    for &(start, len) in &snapshot.machine.ram_regions {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            memory
                .read_slice(&mut buf[..n], GuestAddress(start + done))
                .map_err(|e| SnapshotError::Invalid(format!("cannot read guest RAM: {e}")))?;
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io)?;
            done += n as u64;
        }
    }
    write_section_header(&mut out, TAG_END, 0, 0).map_err(io)?;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.seek(SeekFrom::Start(ram_header_at)).map_err(io)?;
    write_section_header(file, TAG_RAM, ram_len, hasher.finalize()).map_err(io)?;
    Ok(ram_header_at + SECTION_HEADER_LEN + ram_len + SECTION_HEADER_LEN)
}

fn write_section_header(
    out: &mut impl Write,
    tag: &[u8; 4],
    len: u64,
    crc: u32,
) -> std::io::Result<()> {
    out.write_all(tag)?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&crc.to_le_bytes())
}

/// An opened, checked snapshot whose RAM is still in the file.
pub struct SnapshotReader {
    path: PathBuf,
    file: File,
    /// The metadata: machine shape and all non-RAM state.
    pub snapshot: VmSnapshot,
    ram_offset: u64,
    ram_crc: u32,
}

impl std::fmt::Debug for SnapshotReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("path", &self.path)
            .field("machine", &self.snapshot.machine)
            .finish_non_exhaustive()
    }
}

impl SnapshotReader {
    /// Opens `path` and checks its header, versions, metadata checksum and
    /// length. No KVM work.
    pub fn open(path: &Path) -> Result<SnapshotReader, SnapshotError> {
        let file = File::open(path).map_err(|error| SnapshotError::Open {
            path: path.to_owned(),
            error,
        })?;
        let file_len = file
            .metadata()
            .map_err(|e| SnapshotError::io(path, e))?
            .len();
        let mut input = BufReader::new(file);
        let corrupt = |what: String| SnapshotError::Corrupt {
            path: path.to_owned(),
            what,
        };
        let truncated = |what: &str| SnapshotError::Truncated {
            path: path.to_owned(),
            what: what.to_string(),
        };
        let mut read = |buf: &mut [u8], what: &str| -> Result<(), SnapshotError> {
            input.read_exact(buf).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => truncated(what),
                _ => SnapshotError::io(path, e),
            })
        };

        let mut header = vec![0u8; 14];
        read(&mut header, "header")?;
        if &header[..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot(path.to_owned()));
        }
        let version_len = u16::from_le_bytes([header[12], header[13]]) as usize;
        let mut rest = vec![0u8; version_len + 4];
        read(&mut rest, "header")?;
        header.extend_from_slice(&rest[..version_len]);
        let crc = u32::from_le_bytes(rest[version_len..].try_into().unwrap_or_default());
        if crc32fast::hash(&header) != crc {
            return Err(corrupt("header checksum mismatch".into()));
        }
        let format = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
        if format != FORMAT_VERSION {
            return Err(SnapshotError::FormatVersion {
                path: path.to_owned(),
                found: format,
            });
        }
        let made_by = String::from_utf8_lossy(&header[14..]).into_owned();
        if made_by != HAKONIWA_VERSION {
            return Err(SnapshotError::HakoniwaVersion {
                path: path.to_owned(),
                found: made_by,
            });
        }
        let mut offset = header.len() as u64 + 4;

        let (tag, meta_len, meta_crc) = read_section_header(&mut read, "metadata")?;
        if &tag != TAG_META {
            return Err(corrupt("no metadata section".into()));
        }
        if meta_len > MAX_META_LEN {
            return Err(corrupt(format!(
                "metadata length {meta_len} is implausible"
            )));
        }
        if offset + SECTION_HEADER_LEN + meta_len > file_len {
            return Err(truncated("metadata"));
        }
        let mut meta = vec![0u8; meta_len as usize];
        read(&mut meta, "metadata")?;
        if crc32fast::hash(&meta) != meta_crc {
            return Err(corrupt("metadata checksum mismatch".into()));
        }
        let snapshot: VmSnapshot =
            serde_json::from_slice(&meta).map_err(|e| corrupt(format!("metadata: {e}")))?;
        offset += SECTION_HEADER_LEN + meta_len;

        let (tag, ram_len, ram_crc) = read_section_header(&mut read, "RAM")?;
        if &tag != TAG_RAM {
            return Err(corrupt("no RAM section".into()));
        }
        let expected_regions: Vec<(u64, u64)> =
            arch::layout::ram_regions(snapshot.machine.memory_bytes);
        let regions_len: u64 = snapshot.machine.ram_regions.iter().map(|r| r.1).sum();
        if snapshot.machine.ram_regions != expected_regions || ram_len != regions_len {
            return Err(corrupt(
                "RAM section does not match the memory layout".into(),
            ));
        }
        let ram_offset = offset + SECTION_HEADER_LEN;
        let complete_len = ram_offset + ram_len + SECTION_HEADER_LEN;
        if file_len < complete_len {
            return Err(SnapshotError::Truncated {
                path: path.to_owned(),
                what: format!("{} of {} bytes", file_len, complete_len),
            });
        }
        if file_len > complete_len {
            return Err(corrupt(format!(
                "{} bytes after the end",
                file_len - complete_len
            )));
        }
        let mut file = input.into_inner();
        file.seek(SeekFrom::Start(ram_offset + ram_len))
            .map_err(|e| SnapshotError::io(path, e))?;
        let mut end = [0u8; SECTION_HEADER_LEN as usize];
        file.read_exact(&mut end)
            .map_err(|e| SnapshotError::io(path, e))?;
        if &end[..4] != TAG_END || end[4..].iter().any(|&b| b != 0) {
            return Err(corrupt("no end marker".into()));
        }
        Ok(SnapshotReader {
            path: path.to_owned(),
            file,
            snapshot,
            ram_offset,
            ram_crc,
        })
    }

    /// The file this snapshot came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies the RAM section into `memory` (laid out as the snapshot's
    /// regions) and checks its checksum.
    pub fn load_ram(&mut self, memory: &GuestMemoryMmap) -> Result<(), SnapshotError> {
        let path = self.path.clone();
        let io = |e| SnapshotError::io(&path, e);
        self.file
            .seek(SeekFrom::Start(self.ram_offset))
            .map_err(io)?;
        let mut input = BufReader::with_capacity(CHUNK, &mut self.file);
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        for &(start, len) in &self.snapshot.machine.ram_regions {
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(CHUNK as u64) as usize;
                input.read_exact(&mut buf[..n]).map_err(io)?;
                hasher.update(&buf[..n]);
                memory
                    .write_slice(&buf[..n], GuestAddress(start + done))
                    .map_err(|e| SnapshotError::Invalid(format!("cannot write guest RAM: {e}")))?;
                done += n as u64;
            }
        }
        if hasher.finalize() != self.ram_crc {
            return Err(SnapshotError::Corrupt {
                path: self.path.clone(),
                what: "guest RAM checksum mismatch".into(),
            });
        }
        Ok(())
    }
}

fn read_section_header(
    read: &mut impl FnMut(&mut [u8], &str) -> Result<(), SnapshotError>,
    what: &str,
) -> Result<([u8; 4], u64, u32), SnapshotError> {
    let mut raw = [0u8; SECTION_HEADER_LEN as usize];
    read(&mut raw, what)?;
    let mut tag = [0u8; 4];
    tag.copy_from_slice(&raw[..4]);
    let len = u64::from_le_bytes(raw[4..12].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(raw[12..16].try_into().unwrap_or_default());
    Ok((tag, len, crc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    /// A one-vCPU VM's metadata with zeroed KVM structures (no KVM needed).
    fn snapshot(memory_bytes: u64) -> VmSnapshot {
        let machine = serde_json::from_value(serde_json::json!({
            "memory_bytes": memory_bytes, "vcpus": 1,
            "ram_regions": arch::layout::ram_regions(memory_bytes),
            "devices": [["com1", "serial-16550a"]], "boot_protocol": "pvh",
            "kernel": "vmlinux", "cmdline": "console=ttyS0"
        }))
        .unwrap();
        VmSnapshot::sample(&machine)
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hakoniwa-snapfile-{}-{name}", std::process::id()))
    }

    #[test]
    fn ram_and_state_round_trip_and_damage_is_found() {
        let size = 4 << 20;
        let memory = create_guest_memory(size).unwrap();
        for (i, addr) in [0u64, 4095, 1 << 20, size - 1].into_iter().enumerate() {
            memory.write_obj(i as u8 + 1, GuestAddress(addr)).unwrap();
        }
        let path = temp("round-trip");
        let written = write_snapshot(&path, &snapshot(size), &memory).unwrap();
        assert_eq!(written, std::fs::metadata(&path).unwrap().len());

        let mut reader = SnapshotReader::open(&path).unwrap();
        assert_eq!(reader.snapshot.machine, snapshot(size).machine);
        assert_eq!(reader.snapshot.devices, snapshot(size).devices);
        assert_eq!(
            reader.snapshot.vcpus[0].msrs,
            vec![super::super::state::MsrValue {
                index: 16,
                data: 12345
            }]
        );
        assert_eq!(reader.snapshot.vcpus[0].regs.rip, 0);
        let copy = create_guest_memory(size).unwrap();
        reader.load_ram(&copy).unwrap();
        for (i, addr) in [0u64, 4095, 1 << 20, size - 1].into_iter().enumerate() {
            assert_eq!(
                copy.read_obj::<u8>(GuestAddress(addr)).unwrap(),
                i as u8 + 1
            );
        }

        // One flipped bit in RAM: found while loading.
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - SECTION_HEADER_LEN as usize - 100;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let mut reader = SnapshotReader::open(&path).unwrap();
        let err = reader.load_ram(&copy).unwrap_err().to_string();
        assert!(err.contains("guest RAM checksum mismatch"), "{err}");

        // Cut short: found when opening.
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, &bytes).unwrap();
        let err = SnapshotReader::open(&path).unwrap_err().to_string();
        assert!(err.contains("is truncated"), "{err}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        let memory = create_guest_memory(2 << 20).unwrap();
        let path = Path::new("/nonexistent-dir/vm.snap");
        let err = write_snapshot(path, &snapshot(2 << 20), &memory).unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir"), "{err}");
    }
}

//! A Linux TAP interface opened through `/dev/net/tun`.
//!
//! `TUNSETIFF` with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` attaches to the
//! named interface, creating it if it does not exist (that needs
//! CAP_NET_ADMIN; a persistent TAP made beforehand with
//! `ip tuntap add NAME mode tap user U` does not). `TUNSETVNETHDRSZ 12`
//! makes every frame carry a `virtio_net_hdr_v1`, so guest frames are
//! written as the guest made them. The fd is non-blocking.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use super::{NetBackend, NET_HDR_LEN};

/// Why a TAP could not be opened. Each message is one line naming the TAP.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("tap name '{name}' is invalid: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("tap '{name}': cannot open /dev/net/tun: {reason}")]
    OpenTun { name: String, reason: String },
    #[error("tap '{name}': cannot attach: {reason}")]
    Attach { name: String, reason: String },
    #[error("tap '{name}': {op} failed: {err}")]
    Ioctl {
        name: String,
        op: &'static str,
        err: io::Error,
    },
}

/// Checks a TAP name the way the kernel will (`dev_valid_name`).
pub fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Err("'.' and '..' are not interface names");
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err("'/', ':', NUL and whitespace are not allowed");
    }
    Ok(())
}

/// An open TAP queue.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Opens (or creates) TAP `name` with a virtio-net v1 header.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        validate_name(name).map_err(|reason| TapError::InvalidName {
            name: name.to_string(),
            reason,
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|e| TapError::OpenTun {
                name: name.to_string(),
                reason: match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
                        format!("{e} (is the tun module loaded? modprobe tun)")
                    }
                    Some(libc::EACCES) | Some(libc::EPERM) => {
                        format!("{e} (needs access to /dev/net/tun)")
                    }
                    _ => e.to_string(),
                },
            })?;

        // SAFETY: ifreq is plain old data (arrays, integers, a union of
        // such); all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `ifr`
        // is and outlives the call; the fd is ours.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        if ret < 0 {
            let e = io::Error::last_os_error();
            let reason = match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => format!(
                    "{e} (creating a TAP needs CAP_NET_ADMIN; or create it first: \
                     ip tuntap add {name} mode tap user $USER)"
                ),
                Some(libc::EBUSY) => format!("{e} (in use by another process?)"),
                Some(libc::EINVAL) => format!("{e} (exists but is not a TAP, or flags differ)"),
                _ => e.to_string(),
            };
            return Err(TapError::Attach {
                name: name.to_string(),
                reason,
            });
        }
        // The kernel writes back the name it used (it expands "%d").
        let actual: Vec<u8> = ifr
            .ifr_name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let name = String::from_utf8_lossy(&actual).into_owned();

        let hdr_len: libc::c_int = NET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which
        // points at `hdr_len` for the duration of the call.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) };
        if ret < 0 {
            return Err(TapError::Ioctl {
                name,
                op: "TUNSETVNETHDRSZ",
                err: io::Error::last_os_error(),
            });
        }
        let tap = Tap { file, name };
        // Start with no offloads: frames from the host are plain until the
        // driver accepts checksum/TSO offloads.
        tap.set_offload(0).map_err(|err| TapError::Ioctl {
            name: tap.name.clone(),
            op: "TUNSETOFFLOAD",
            err,
        })?;
        Ok(tap)
    }

    /// The interface's name as the kernel knows it.
    pub fn if_name(&self) -> &str {
        &self.name
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }

    fn set_offload(&self, tun_flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value; no memory is
        // passed.
        let ret = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(tun_flags),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }
}

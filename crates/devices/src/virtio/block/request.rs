//! One virtio-blk request: parsed from a descriptor chain, then executed
//! against a [`DiskBackend`] (virtio 1.2 §5.2.6).
//!
//! A request is a device-readable header (type, ioprio, sector: 16 bytes),
//! data (device-readable for OUT, DISCARD and WRITE_ZEROES, device-writable
//! for IN and GET_ID) and one device-writable status byte, the last byte of
//! the chain. Framing is free (VIRTIO_F_ANY_LAYOUT is implied by virtio
//! 1.x): the header may share a descriptor with data, data may be split
//! anywhere, so the chain is read as two byte streams with virtio-queue's
//! [`Reader`] and [`Writer`], which check every buffer against guest memory
//! before anything is copied.
//!
//! Nothing the guest puts in the ring can make the device panic, hang, or
//! touch memory outside the guest: a chain that cannot be walked (a loop,
//! too long, a `next` outside the table, a bad indirect table) or has no
//! writable byte is completed with length 0 and nothing written; any other
//! defect fails the request with VIRTIO_BLK_S_IOERR in its status byte.

use std::io::{Read, Write};
use std::ops::Deref;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::bitmap::{AtomicBitmap, BS};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use super::counters::{Outcome, RequestKind};
use super::error_policy::{Access, ErrorAction, ErrorPolicy};
use super::io::{AlignedBuf, DiskBackend};
use super::metrics::{add, Metrics};
use super::{SECTOR_SHIFT, SECTOR_SIZE, SERIAL_LEN};
use crate::GuestMemoryMmap;

/// The request completed.
pub const VIRTIO_BLK_S_OK: u8 = 0;
/// The request failed.
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
/// The request type is not supported (or not negotiated).
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Largest DISCARD, in sectors (hole punching is cheap).
pub const MAX_DISCARD_SECTORS: u32 = u32::MAX;
/// Largest WRITE_ZEROES, in sectors (1 GiB: without fallocate support the
/// zeroes are written).
pub const MAX_WRITE_ZEROES_SECTORS: u32 = 1 << 21;
/// Segments per DISCARD or WRITE_ZEROES request.
pub const MAX_DISCARD_SEG: u32 = 1;
/// Discard granularity advertised, in sectors (4 KiB, a file system block).
pub const DISCARD_SECTOR_ALIGNMENT: u32 = 8;

const HEADER_LEN: usize = 16;
const SEGMENT_LEN: usize = 16;

/// The guest memory's bitmap slice type (what its Reader/Writer carry).
type Slice<'a> = BS<'a, AtomicBitmap>;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    /// Any other type (SCSI, zoned, secure erase, ...): VIRTIO_BLK_S_UNSUPP.
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(t: u32) -> RequestType {
        match t {
            VIRTIO_BLK_T_IN => RequestType::In,
            VIRTIO_BLK_T_OUT => RequestType::Out,
            VIRTIO_BLK_T_FLUSH => RequestType::Flush,
            VIRTIO_BLK_T_GET_ID => RequestType::GetId,
            VIRTIO_BLK_T_DISCARD => RequestType::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => RequestType::WriteZeroes,
            other => RequestType::Unsupported(other),
        }
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("the descriptor chain is empty, loops, is too long or leaves its table")]
    BrokenChain,
    #[error("the chain has no device-writable byte for the status")]
    NoStatus,
    #[error("a device-readable descriptor follows a device-writable one")]
    Misordered,
    #[error("a device-writable buffer is not in guest memory")]
    BadWritableBuffer,
    #[error("a device-readable buffer is not in guest memory")]
    BadReadableBuffer,
    #[error("the request header is shorter than {HEADER_LEN} bytes")]
    ShortHeader,
    #[error("the data buffers have the wrong direction for the request type")]
    WrongDirection,
    #[error("data length {0} is not a multiple of {SECTOR_SIZE}")]
    UnalignedLength(u64),
    #[error("sectors {sector}..+{sectors} are beyond the capacity ({capacity} sectors)")]
    OutOfRange {
        sector: u64,
        sectors: u64,
        capacity: u64,
    },
    #[error("the disk is read-only")]
    ReadOnly,
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("{0} was not negotiated")]
    NotNegotiated(&'static str),
    #[error("malformed discard/write-zeroes segments")]
    BadSegments,
    #[error("unsupported discard/write-zeroes flags {0:#x}")]
    BadFlags(u32),
    #[error("{0} sectors exceed the per-request maximum")]
    TooLarge(u32),
    #[error("I/O error: {0}")]
    Io(String),
    /// The disk back end failed (the host's errno): subject to
    /// `werror`/`rerror` (see [`super::error_policy`]).
    #[error("host I/O error: {message}")]
    Host { errno: i32, message: String },
}

impl RequestError {
    /// For the statistics: a host I/O error failed the request, anything
    /// else refused it before it reached the disk.
    fn outcome(&self) -> Outcome {
        match self {
            RequestError::Io(_) | RequestError::Host { .. } => Outcome::Failed,
            _ => Outcome::Invalid,
        }
    }

    fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported(_)
            | RequestError::NotNegotiated(_)
            | RequestError::BadFlags(_) => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        }
    }
}

impl RequestError {
    /// A failure of the disk back end.
    fn host(e: std::io::Error) -> RequestError {
        RequestError::Host {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            message: e.to_string(),
        }
    }
}

impl From<std::io::Error> for RequestError {
    fn from(e: std::io::Error) -> RequestError {
        RequestError::Io(e.to_string())
    }
}

/// A chain that is not a well-formed request.
#[derive(Debug)]
pub struct Malformed {
    /// What is wrong.
    pub error: RequestError,
    /// The status byte, when the chain has one in guest memory.
    pub status: Option<GuestAddress>,
}

/// A parsed request whose buffers are all in guest memory.
pub struct Request<'a> {
    /// The request type from the header.
    pub request_type: RequestType,
    /// The first sector (IN and OUT).
    pub sector: u64,
    /// The device-readable bytes after the header.
    reader: Reader<'a, Slice<'a>>,
    /// The device-writable bytes before the status byte.
    writer: Writer<'a, Slice<'a>>,
    /// The status byte (checked to be in guest memory).
    status: GuestAddress,
}

/// What a request runs against.
pub struct RequestContext<'a> {
    pub disk: &'a dyn DiskBackend,
    /// The capacity in sectors.
    pub capacity: u64,
    /// Writes, discards and write-zeroes fail without touching the disk.
    pub readonly: bool,
    /// The features the driver accepted (DISCARD, WRITE_ZEROES, FLUSH).
    pub acked_features: u64,
    /// The GET_ID answer.
    pub serial: [u8; SERIAL_LEN],
    pub metrics: &'a Metrics,
    /// What a host I/O error does (`werror=`, `rerror=`).
    pub errors: ErrorPolicy,
}

impl From<RequestType> for RequestKind {
    fn from(t: RequestType) -> RequestKind {
        match t {
            RequestType::In => RequestKind::Read,
            RequestType::Out => RequestKind::Write,
            RequestType::Flush => RequestKind::Flush,
            RequestType::Discard => RequestKind::Discard,
            RequestType::WriteZeroes => RequestKind::WriteZeroes,
            RequestType::GetId | RequestType::Unsupported(_) => RequestKind::Other,
        }
    }
}

/// A chain's completion and what the statistics count of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Processed {
    pub completion: Completion,
    pub kind: RequestKind,
    pub outcome: Outcome,
    /// Bytes read, written, discarded or zeroed (0 unless `outcome` is Ok).
    pub bytes: u64,
}

/// How a chain was completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The status written, or None if the chain had no status byte.
    pub status: Option<u8>,
    /// Bytes written into the chain's device-writable buffers: the length
    /// for the used ring.
    pub used_len: u32,
    /// The request failed on the host and its policy is `stop`: nothing
    /// was written to the status byte; the caller holds the chain and
    /// runs it again at the resume.
    pub hold: Option<HoldCause>,
}

/// Why a request is held (see [`Completion::hold`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldCause {
    /// "read", "write", "flush", "discard" or "write-zeroes".
    pub what: &'static str,
    pub errno: i32,
}

impl RequestType {
    /// What the error policy calls this request, and its name, if it
    /// touches the image.
    fn access(self) -> Option<(Access, &'static str)> {
        match self {
            RequestType::In => Some((Access::Read, "read")),
            RequestType::Out => Some((Access::Write, "write")),
            RequestType::Flush => Some((Access::Write, "flush")),
            RequestType::Discard => Some((Access::Write, "discard")),
            RequestType::WriteZeroes => Some((Access::Write, "write-zeroes")),
            RequestType::GetId | RequestType::Unsupported(_) => None,
        }
    }
}

impl<'a> Request<'a> {
    /// Splits `chain` into header, data and status, checking every buffer
    /// against `mem` (the memory the chain's addresses refer to).
    pub fn parse<M>(chain: DescriptorChain<M>, mem: &'a GuestMemoryMmap) -> Result<Self, Malformed>
    where
        M: Deref + Clone,
        M::Target: GuestMemory + Sized,
    {
        let malformed = |error, status| Malformed { error, status };

        // Walk the chain once: it must end properly (the last descriptor
        // has no NEXT; the iterator stops early on loops, overlong chains,
        // indices or indirect tables out of bounds), readable descriptors
        // must come first, and the status is the last writable byte.
        let mut count = 0usize;
        let mut last_has_next = false;
        let mut seen_writable = false;
        let mut misordered = false;
        let mut status = None;
        for desc in chain.clone() {
            count += 1;
            last_has_next = desc.has_next();
            if desc.is_write_only() {
                seen_writable = true;
                if desc.len() > 0 {
                    status = desc.addr().checked_add(u64::from(desc.len()) - 1);
                }
            } else if seen_writable {
                misordered = true;
            }
        }
        if count == 0 || last_has_next {
            return Err(malformed(RequestError::BrokenChain, None));
        }
        let status = status.filter(|a| mem.check_range(*a, 1, Permissions::Write));
        let Some(status_addr) = status else {
            return Err(malformed(RequestError::NoStatus, None));
        };
        if misordered {
            return Err(malformed(RequestError::Misordered, status));
        }

        let mut writer = Writer::new(mem, chain.clone())
            .map_err(|_| malformed(RequestError::BadWritableBuffer, status))?;
        let data_len = writer.available_bytes().saturating_sub(1);
        // Keep everything before the status byte; the byte itself is
        // written through its address.
        writer
            .split_at(data_len)
            .map_err(|_| malformed(RequestError::BadWritableBuffer, status))?;
        let mut reader = Reader::new(mem, chain)
            .map_err(|_| malformed(RequestError::BadReadableBuffer, status))?;
        let mut header = [0u8; HEADER_LEN];
        reader
            .read_exact(&mut header)
            .map_err(|_| malformed(RequestError::ShortHeader, status))?;
        let request_type = u32::from_le_bytes(header[0..4].try_into().unwrap()).into();
        let sector = u64::from_le_bytes(header[8..16].try_into().unwrap());
        Ok(Request {
            request_type,
            sector,
            reader,
            writer,
            status: status_addr,
        })
    }

    /// The status byte's guest address.
    pub fn status_addr(&self) -> GuestAddress {
        self.status
    }

    /// Runs the request: moves data between the guest and the disk through
    /// `scratch`, writes the status byte, and returns the completion.
    pub fn execute(
        self,
        mem: &GuestMemoryMmap,
        ctx: &RequestContext,
        scratch: &mut AlignedBuf,
    ) -> Completion {
        self.execute_counted(mem, ctx, scratch).completion
    }

    /// [`execute`](Self::execute), also saying what the statistics count.
    pub fn execute_counted(
        mut self,
        mem: &GuestMemoryMmap,
        ctx: &RequestContext,
        scratch: &mut AlignedBuf,
    ) -> Processed {
        // (result, bytes for the used ring, bytes moved for the statistics)
        let (result, data_len, moved) = match self.request_type {
            RequestType::In => {
                let (result, n) = self.read(ctx, scratch);
                (result, n, n)
            }
            RequestType::Out => split_moved(self.write(ctx, scratch)),
            RequestType::Flush => (flush(ctx), 0, 0),
            RequestType::GetId => {
                let (result, n) = self.get_id(ctx);
                (result, n, 0)
            }
            RequestType::Discard | RequestType::WriteZeroes => split_moved(self.discard(ctx)),
            RequestType::Unsupported(t) => (Err(RequestError::Unsupported(t)), 0, 0),
        };
        if let (Err(RequestError::Host { errno, .. }), Some((access, what))) =
            (&result, self.request_type.access())
        {
            if ctx.errors.decide(access) == ErrorAction::Stop {
                // Not counted: it runs again at the resume.
                return Processed {
                    completion: Completion {
                        status: None,
                        used_len: 0,
                        hold: Some(HoldCause {
                            what,
                            errno: *errno,
                        }),
                    },
                    kind: self.request_type.into(),
                    outcome: Outcome::Failed,
                    bytes: 0,
                };
            }
        }
        let (status, outcome) = match &result {
            Ok(()) => (VIRTIO_BLK_S_OK, Outcome::Ok),
            Err(e) => {
                tracing::debug!("virtio-blk {:?} request failed: {e}", self.request_type);
                (e.status(), e.outcome())
            }
        };
        Processed {
            completion: write_status(mem, self.status, status, data_len),
            kind: self.request_type.into(),
            outcome,
            bytes: if outcome == Outcome::Ok { moved } else { 0 },
        }
    }

    fn check_range(&self, ctx: &RequestContext, len: u64) -> Result<u64, RequestError> {
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::UnalignedLength(len));
        }
        check_sectors(ctx, self.sector, len >> SECTOR_SHIFT)
    }

    /// IN: returns the bytes put in the guest's buffers.
    fn read(
        &mut self,
        ctx: &RequestContext,
        scratch: &mut AlignedBuf,
    ) -> (Result<(), RequestError>, u64) {
        // IN data is device-writable; device-readable data means the
        // driver got the directions wrong.
        if self.reader.available_bytes() > 0 {
            return (Err(RequestError::WrongDirection), 0);
        }
        let len = self.writer.available_bytes() as u64;
        let mut offset = match self.check_range(ctx, len) {
            Ok(o) => o,
            Err(e) => return (Err(e), 0),
        };
        let result = (|| {
            while self.writer.available_bytes() > 0 {
                let n = self.writer.available_bytes().min(scratch.len());
                ctx.disk
                    .read_at(&mut scratch[..n], offset)
                    .map_err(RequestError::host)?;
                self.writer.write_all(&scratch[..n])?;
                offset += n as u64;
                add(&ctx.metrics.read_bytes, n as u64);
            }
            Ok(())
        })();
        (result, self.writer.bytes_written() as u64)
    }

    /// OUT: returns the bytes written.
    fn write(
        &mut self,
        ctx: &RequestContext,
        scratch: &mut AlignedBuf,
    ) -> Result<u64, RequestError> {
        if ctx.readonly {
            return Err(RequestError::ReadOnly);
        }
        if self.writer.available_bytes() > 0 {
            return Err(RequestError::WrongDirection);
        }
        let len = self.reader.available_bytes() as u64;
        let mut offset = self.check_range(ctx, len)?;
        while self.reader.available_bytes() > 0 {
            let n = self.reader.available_bytes().min(scratch.len());
            self.reader.read_exact(&mut scratch[..n])?;
            ctx.disk
                .write_at(&scratch[..n], offset)
                .map_err(RequestError::host)?;
            offset += n as u64;
            add(&ctx.metrics.write_bytes, n as u64);
        }
        write_through(ctx).map(|()| len)
    }

    /// GET_ID: the serial, cut to the buffer the driver gave.
    fn get_id(&mut self, ctx: &RequestContext) -> (Result<(), RequestError>, u64) {
        let n = self.writer.available_bytes().min(SERIAL_LEN);
        let result = self
            .writer
            .write_all(&ctx.serial[..n])
            .map_err(RequestError::from);
        (result, self.writer.bytes_written() as u64)
    }

    /// DISCARD and WRITE_ZEROES: one segment of {sector, num_sectors,
    /// flags}; returns the bytes of the range.
    fn discard(&mut self, ctx: &RequestContext) -> Result<u64, RequestError> {
        let zeroes = self.request_type == RequestType::WriteZeroes;
        let (feature, name, max) = if zeroes {
            (
                VIRTIO_BLK_F_WRITE_ZEROES,
                "VIRTIO_BLK_F_WRITE_ZEROES",
                MAX_WRITE_ZEROES_SECTORS,
            )
        } else {
            (
                VIRTIO_BLK_F_DISCARD,
                "VIRTIO_BLK_F_DISCARD",
                MAX_DISCARD_SECTORS,
            )
        };
        if ctx.acked_features & (1 << feature) == 0 {
            return Err(RequestError::NotNegotiated(name));
        }
        if ctx.readonly {
            return Err(RequestError::ReadOnly);
        }
        let len = self.reader.available_bytes();
        if len == 0 || !len.is_multiple_of(SEGMENT_LEN) {
            return Err(RequestError::BadSegments);
        }
        if len / SEGMENT_LEN > MAX_DISCARD_SEG as usize {
            return Err(RequestError::BadSegments);
        }
        let mut seg = [0u8; SEGMENT_LEN];
        self.reader.read_exact(&mut seg)?;
        let sector = u64::from_le_bytes(seg[0..8].try_into().unwrap());
        let sectors = u32::from_le_bytes(seg[8..12].try_into().unwrap());
        let flags = u32::from_le_bytes(seg[12..16].try_into().unwrap());
        let unmap = flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
        // The unmap flag is only meaningful for WRITE_ZEROES; any other
        // bit is reserved.
        if flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 || (unmap && !zeroes) {
            return Err(RequestError::BadFlags(flags));
        }
        if sectors > max {
            return Err(RequestError::TooLarge(sectors));
        }
        let offset = check_sectors(ctx, sector, u64::from(sectors))?;
        if sectors == 0 {
            return Ok(0);
        }
        let len = u64::from(sectors) << SECTOR_SHIFT;
        if zeroes {
            ctx.disk
                .write_zeroes(offset, len, unmap)
                .map_err(RequestError::host)?;
        } else {
            ctx.disk.discard(offset, len).map_err(RequestError::host)?;
        }
        write_through(ctx).map(|()| len)
    }
}

/// A result with the bytes moved → (result, no data for the used ring,
/// bytes moved).
fn split_moved(result: Result<u64, RequestError>) -> (Result<(), RequestError>, u64, u64) {
    match result {
        Ok(moved) => (Ok(()), 0, moved),
        Err(e) => (Err(e), 0, 0),
    }
}

/// The byte offset of `sectors` sectors from `sector`, if they are all
/// within the capacity.
fn check_sectors(ctx: &RequestContext, sector: u64, sectors: u64) -> Result<u64, RequestError> {
    match sector.checked_add(sectors) {
        Some(end) if end <= ctx.capacity => Ok(sector << SECTOR_SHIFT),
        _ => Err(RequestError::OutOfRange {
            sector,
            sectors,
            capacity: ctx.capacity,
        }),
    }
}

fn flush(ctx: &RequestContext) -> Result<(), RequestError> {
    if ctx.disk.flush().map_err(RequestError::host)? {
        add(&ctx.metrics.syncs, 1);
    }
    Ok(())
}

/// Without VIRTIO_BLK_F_FLUSH the driver cannot flush, so the device must
/// be write-through: every write is made durable before it completes.
fn write_through(ctx: &RequestContext) -> Result<(), RequestError> {
    if ctx.acked_features & (1 << VIRTIO_BLK_F_FLUSH) == 0 {
        flush(ctx)?;
    }
    Ok(())
}

fn write_status(
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    status: u8,
    data_len: u64,
) -> Completion {
    match mem.write_obj(status, addr) {
        Ok(()) => Completion {
            status: Some(status),
            used_len: u32::try_from(data_len + 1).unwrap_or(u32::MAX),
            hold: None,
        },
        // Checked at parse time; only a memory hot-unplug could get here.
        Err(_) => Completion {
            status: None,
            used_len: 0,
            hold: None,
        },
    }
}

/// Parses and runs the request in `chain`, whatever it holds, and counts
/// it in `ctx.metrics` (not its latency: the caller knows when it took
/// the chain). This is the whole device-side handling of one chain, also
/// the entry point of the `block_request` fuzz target.
pub fn process_chain<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    ctx: &RequestContext,
    scratch: &mut AlignedBuf,
) -> Completion
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    process_chain_counted(chain, mem, ctx, scratch).completion
}

/// [`process_chain`], also saying what the disk's statistics count of the
/// request (its kind, outcome and bytes).
pub fn process_chain_counted<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    ctx: &RequestContext,
    scratch: &mut AlignedBuf,
) -> Processed
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let m = ctx.metrics;
    let processed = match Request::parse(chain, mem) {
        Ok(request) => {
            let counter = match request.request_type {
                RequestType::In => &m.read_requests,
                RequestType::Out => &m.write_requests,
                RequestType::Flush => &m.flush_requests,
                RequestType::Discard | RequestType::WriteZeroes => &m.discard_requests,
                RequestType::GetId | RequestType::Unsupported(_) => &m.other_requests,
            };
            add(counter, 1);
            request.execute_counted(mem, ctx, scratch)
        }
        Err(malformed) => {
            add(&m.other_requests, 1);
            tracing::debug!("virtio-blk: malformed request: {}", malformed.error);
            let completion = match malformed.status {
                Some(addr) => write_status(mem, addr, malformed.error.status(), 0),
                None => Completion {
                    status: None,
                    used_len: 0,
                    hold: None,
                },
            };
            Processed {
                completion,
                kind: RequestKind::Other,
                outcome: Outcome::Invalid,
                bytes: 0,
            }
        }
    };
    if processed.completion.status != Some(VIRTIO_BLK_S_OK) {
        add(&m.errors, 1);
    }
    processed
}

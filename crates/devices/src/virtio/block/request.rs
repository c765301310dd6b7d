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
use vm_memory::bitmap::{AtomicBitmap, Bitmap, BS};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use super::counters::{Outcome, RequestKind};
use super::engine::{run_blocking, IoOp, OpKind};
use super::error_policy::{Access, ErrorAction, ErrorPolicy};
use super::io::{AlignedBuf, DiskBackend};
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
/// The largest bounce buffer an engine's op gets; a larger access that
/// needs one (no Linux driver sends one) runs alone, in pieces.
const MAX_BOUNCE: usize = 4 << 20;
/// At most this many iovecs per op (the kernel's IOV_MAX); a chain split
/// finer goes through a bounce buffer.
const MAX_IOVECS: usize = 1024;

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
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
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
    /// Not a failure: the access must run alone (see [`Started::Alone`]).
    #[error("the access must run alone")]
    NeedsAlone,
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
    /// The chain's device-readable and device-writable buffers in order,
    /// for the engines' iovecs.
    readable: Vec<(GuestAddress, usize)>,
    writable: Vec<(GuestAddress, usize)>,
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
        let (mut readable, mut writable) = (Vec::new(), Vec::new());
        for desc in chain.clone() {
            count += 1;
            last_has_next = desc.has_next();
            let buffer = (desc.addr(), desc.len() as usize);
            if desc.is_write_only() {
                writable.push(buffer);
                seen_writable = true;
                if desc.len() > 0 {
                    status = desc.addr().checked_add(u64::from(desc.len()) - 1);
                }
            } else if seen_writable {
                misordered = true;
            } else {
                readable.push(buffer);
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
            readable,
            writable,
        })
    }

    /// The status byte's guest address.
    pub fn status_addr(&self) -> GuestAddress {
        self.status
    }

    /// Starts the request: what needs no engine is done here (GET_ID,
    /// DISCARD, WRITE_ZEROES, flushes the cache mode ignores, every
    /// failure); a read, write or flush becomes an [`IoOp`] for the
    /// queue's engine; an access O_DIRECT cannot take is left to run
    /// alone ([`Started::Alone`]).
    pub fn start(mut self, mem: &GuestMemoryMmap, ctx: &RequestContext) -> Started<'a> {
        let io = match self.request_type {
            RequestType::In => self.data_op(OpKind::Read, mem, ctx),
            RequestType::Out => self.data_op(OpKind::Write, mem, ctx),
            RequestType::Flush if ctx.disk.ignores_flush() => Ok(None),
            // After a failed sync every flush fails without syncing, in
            // every engine (see [`super::sticky`]).
            RequestType::Flush => match ctx.disk.sticky().and_then(|s| s.refusal()) {
                Some(e) => Err(RequestError::host(e)),
                None => Ok(Some(IoOp::flush())),
            },
            RequestType::GetId => {
                let (result, data_len) = self.get_id(ctx);
                return Started::Done(self.complete(mem, ctx, result, data_len, 0));
            }
            RequestType::Discard | RequestType::WriteZeroes => {
                let (result, data_len, moved) = split_moved(self.discard(ctx));
                return Started::Done(self.complete(mem, ctx, result, data_len, moved));
            }
            RequestType::Unsupported(t) => Err(RequestError::Unsupported(t)),
        };
        match io {
            Ok(Some(op)) => {
                let segments = match op.kind {
                    OpKind::Read => data_segments(&self.writable, 0, 1),
                    OpKind::Write => data_segments(&self.readable, HEADER_LEN, 0),
                    OpKind::Flush => Vec::new(),
                };
                let pending = PendingIo {
                    request_type: self.request_type,
                    status: self.status,
                    len: op.len(),
                    segments,
                };
                Started::Io(pending, op)
            }
            Ok(None) => Started::Done(self.complete(mem, ctx, Ok(()), 0, 0)),
            Err(RequestError::NeedsAlone) => Started::Alone(self),
            Err(e) => Started::Done(self.complete(mem, ctx, Err(e), 0, 0)),
        }
    }

    /// The op of a read or write: zero-copy over the guest's buffers when
    /// the back end has a descriptor that can take them as they are, else
    /// through a bounce buffer (filled here for a write); None for no
    /// data at all.
    fn data_op(
        &mut self,
        kind: OpKind,
        mem: &GuestMemoryMmap,
        ctx: &RequestContext,
    ) -> Result<Option<IoOp>, RequestError> {
        let (data, other_way) = match kind {
            OpKind::Read => (self.writer.available_bytes(), self.reader.available_bytes()),
            _ => (self.reader.available_bytes(), self.writer.available_bytes()),
        };
        if kind == OpKind::Write && ctx.readonly {
            return Err(RequestError::ReadOnly);
        }
        // Data the wrong way round means the driver got directions wrong.
        if other_way > 0 {
            return Err(RequestError::WrongDirection);
        }
        let offset = self.check_range(ctx, data as u64)?;
        if data == 0 {
            return Ok(None);
        }
        let dsync = kind == OpKind::Write
            && ctx.acked_features & (1 << VIRTIO_BLK_F_FLUSH) == 0
            && !ctx.disk.ignores_flush();
        if dsync {
            // A write-through write promises what a flush does: after a
            // failed sync it fails too, without writing (see
            // [`super::sticky`]), whichever way it would have run.
            if let Some(e) = ctx.disk.sticky().and_then(|s| s.refusal()) {
                return Err(RequestError::host(e));
            }
        }
        let align = usize::try_from(ctx.disk.direct_alignment()).unwrap_or(usize::MAX);
        if offset % align as u64 != 0 || data % align != 0 {
            // O_DIRECT cannot take this access at all (a 512-byte sector
            // on a 4K-sector host disk): the buffered descriptor serves
            // it, alone, as it must not interleave with direct accesses.
            return Err(RequestError::NeedsAlone);
        }
        let mut op = IoOp {
            kind,
            offset,
            iovecs: Vec::new(),
            bounce: None,
            dsync,
        };
        if ctx.disk.raw_fd().is_some() {
            let segments = match kind {
                OpKind::Read => data_segments(&self.writable, 0, 1),
                _ => data_segments(&self.readable, HEADER_LEN, 0),
            };
            let iovecs = guest_iovecs(mem, &segments, kind == OpKind::Read)?;
            let aligned = iovecs
                .iter()
                .all(|v| (v.iov_base as usize | v.iov_len).is_multiple_of(align));
            if aligned && iovecs.len() <= MAX_IOVECS {
                op.iovecs = iovecs;
                return Ok(Some(op));
            }
        }
        if data > MAX_BOUNCE {
            return Err(RequestError::NeedsAlone);
        }
        let mut buf = AlignedBuf::new(data);
        if kind == OpKind::Write {
            self.reader.read_exact(&mut buf[..data])?;
        }
        op.iovecs = vec![libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: data,
        }];
        op.bounce = Some(buf);
        Ok(Some(op))
    }

    /// Ends the request with `result` (see [`conclude`]).
    fn complete(
        &self,
        mem: &GuestMemoryMmap,
        ctx: &RequestContext,
        result: Result<(), RequestError>,
        data_len: u64,
        moved: u64,
    ) -> Processed {
        conclude(
            mem,
            ctx,
            self.request_type,
            self.status,
            result,
            data_len,
            moved,
        )
    }

    /// Runs the request whole on this thread, moving data between the
    /// guest and the disk through `scratch`: for what [`Request::start`]
    /// leaves to run alone. Writes the status byte and returns the
    /// completion.
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
        self.complete(mem, ctx, result, data_len, moved)
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

/// Ends a request with `result`: a host error whose policy is `stop`
/// holds it (nothing written to the guest; it runs again at the resume),
/// anything else writes the status byte. `data_len` is the used length
/// of the data, `moved` the bytes the statistics count.
fn conclude(
    mem: &GuestMemoryMmap,
    ctx: &RequestContext,
    request_type: RequestType,
    status_addr: GuestAddress,
    result: Result<(), RequestError>,
    data_len: u64,
    moved: u64,
) -> Processed {
    if let (Err(RequestError::Host { errno, .. }), Some((access, what))) =
        (&result, request_type.access())
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
                kind: request_type.into(),
                outcome: Outcome::Failed,
                bytes: 0,
            };
        }
    }
    let (status, outcome) = match &result {
        Ok(()) => (VIRTIO_BLK_S_OK, Outcome::Ok),
        Err(e) => {
            tracing::debug!("virtio-blk {request_type:?} request failed: {e}");
            (e.status(), e.outcome())
        }
    };
    Processed {
        completion: write_status(mem, status_addr, status, data_len),
        kind: request_type.into(),
        outcome,
        bytes: if outcome == Outcome::Ok { moved } else { 0 },
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

/// Flushes the back end (whether it synced, its sticky flush state
/// counts).
fn flush(ctx: &RequestContext) -> Result<(), RequestError> {
    ctx.disk.flush().map_err(RequestError::host)?;
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

/// What becomes of a chain once taken off the ring.
pub enum Started<'a> {
    /// Completed already (status written, or held: see
    /// [`Completion::hold`]).
    Done(Processed),
    /// The op for the queue's engine; [`PendingIo::finish`] completes the
    /// request with its result.
    Io(PendingIo, IoOp),
    /// An access O_DIRECT cannot take (cache=none, an offset or length
    /// not aligned to the host's block) or that needs a bounce buffer
    /// above [`MAX_BOUNCE`]: once nothing else is in flight, run it with
    /// [`Request::execute`].
    Alone(Request<'a>),
}

/// A request whose op is with an engine: what completing it needs.
pub struct PendingIo {
    request_type: RequestType,
    status: GuestAddress,
    /// Bytes the op moves.
    len: usize,
    /// The guest buffers of the data, in order (where a bounce buffer's
    /// contents go, and what a zero-copy read dirtied).
    segments: Vec<(GuestAddress, usize)>,
}

impl PendingIo {
    /// Completes the request with its op's `result`: finishes a short
    /// transfer with blocking calls, zero-fills what lies past the end of
    /// the image, copies a bounce buffer to the guest, marks the guest
    /// pages the kernel wrote dirty (for migration's dirty log), counts
    /// the bytes and writes the status byte. A flush's outcome feeds the
    /// disk's sticky flush state, whichever engine ran it; a host error is
    /// subject to the disk's error policy (see [`conclude`]): held, the
    /// guest's buffers get nothing more.
    pub fn finish(
        self,
        mut op: IoOp,
        result: std::io::Result<usize>,
        mem: &GuestMemoryMmap,
        ctx: &RequestContext,
    ) -> Processed {
        let result = match result {
            Ok(n) if n < self.len => run_blocking(&mut op, ctx.disk, n),
            r => r,
        };
        // The engines sync the descriptor themselves (an io_uring fsync,
        // the threads' fdatasync, a write with RWF_DSYNC), not through
        // DiskBackend::flush, which records its own: the outcome is
        // recorded here, once. Without a descriptor the back end's flush
        // ran (see run_blocking).
        let engine_synced = ctx.disk.raw_fd().is_some();
        let result = match (op.kind, ctx.disk.sticky()) {
            (OpKind::Flush, Some(sticky)) if engine_synced => {
                sticky.record(result.map(|_| ())).map(|()| 0)
            }
            // A write-through write (the driver did not negotiate FLUSH)
            // that failed may have met a writeback error that Linux now
            // reports nowhere else: whether the write or its sync failed,
            // it is a failed sync, as a failed fdatasync. Not so when the
            // space ran out: file systems reserve blocks when the write is
            // made, so ENOSPC/EDQUOT/EFBIG come from the write itself,
            // which left nothing durable to lose, and must stay retryable
            // (werror=stop, then resume once there is room).
            (OpKind::Write, Some(sticky))
                if op.dsync && engine_synced && !is_out_of_space(&result) =>
            {
                let moved = result.as_ref().map_or(0, |&n| n);
                sticky.record(result.map(|_| ())).map(|()| moved)
            }
            _ => result,
        };
        let zero_copy = op.bounce.is_none();
        let outcome = match (op.kind, result) {
            (OpKind::Read, Ok(n)) => {
                let copied = match op.bounce.as_mut() {
                    Some(buf) => {
                        buf[n.min(self.len)..self.len].fill(0);
                        write_segments(mem, &self.segments, 0, &buf[..self.len])
                    }
                    None => {
                        mark_dirty(mem, &self.segments);
                        let zeroes = vec![0u8; self.len.saturating_sub(n)];
                        write_segments(mem, &self.segments, n, &zeroes)
                    }
                };
                copied.map(|()| self.len as u64)
            }
            (OpKind::Read, Err(e)) => {
                if zero_copy {
                    // The kernel may have written part of it.
                    mark_dirty(mem, &self.segments);
                }
                Err(RequestError::host(e))
            }
            (OpKind::Write | OpKind::Flush, Ok(_)) => Ok(0),
            (_, Err(e)) => Err(RequestError::host(e)),
        };
        let moved = match op.kind {
            OpKind::Flush => 0,
            _ => self.len as u64,
        };
        let (result, data_len) = match outcome {
            Ok(data_len) => (Ok(()), data_len),
            Err(e) => (Err(e), 0),
        };
        conclude(
            mem,
            ctx,
            self.request_type,
            self.status,
            result,
            data_len,
            moved,
        )
    }
}

/// `buffers` without their first `skip` bytes and last `cut` bytes, empty
/// pieces dropped: the data part of a chain's readable (header first) or
/// writable (status last) buffers.
fn data_segments(
    buffers: &[(GuestAddress, usize)],
    mut skip: usize,
    cut: usize,
) -> Vec<(GuestAddress, usize)> {
    let total: usize = buffers.iter().map(|b| b.1).sum();
    let mut keep = total.saturating_sub(skip).saturating_sub(cut);
    let mut out = Vec::with_capacity(buffers.len());
    for &(addr, len) in buffers {
        let drop_front = skip.min(len);
        skip -= drop_front;
        let n = (len - drop_front).min(keep);
        if n > 0 {
            out.push((addr.unchecked_add(drop_front as u64), n));
            keep -= n;
        }
    }
    out
}

/// The host addresses of guest `segments`, through vm-memory's
/// translation (a segment crossing two regions becomes two iovecs), for
/// the kernel to read (`writable` false) or write.
fn guest_iovecs(
    mem: &GuestMemoryMmap,
    segments: &[(GuestAddress, usize)],
    writable: bool,
) -> Result<Vec<libc::iovec>, RequestError> {
    let bad = if writable {
        RequestError::BadWritableBuffer
    } else {
        RequestError::BadReadableBuffer
    };
    let mut iovecs = Vec::with_capacity(segments.len());
    let access = if writable {
        Permissions::Write
    } else {
        Permissions::Read
    };
    for &(addr, len) in segments {
        let slices = mem.get_slices(addr, len, access).map_err(|_| bad.clone())?;
        for slice in slices {
            let slice = slice.map_err(|_| bad.clone())?;
            let iov_base = if writable {
                slice.ptr_guard_mut().as_ptr()
            } else {
                slice.ptr_guard().as_ptr().cast_mut()
            };
            iovecs.push(libc::iovec {
                iov_base: iov_base.cast(),
                iov_len: slice.len(),
            });
        }
    }
    Ok(iovecs)
}

/// Marks the guest pages of `segments` dirty in guest memory's bitmap:
/// the kernel wrote them, not vm-memory, which would have.
fn mark_dirty(mem: &GuestMemoryMmap, segments: &[(GuestAddress, usize)]) {
    for &(addr, len) in segments {
        let Ok(slices) = mem.get_slices(addr, len, Permissions::Write) else {
            continue;
        };
        for slice in slices.flatten() {
            slice.bitmap().mark_dirty(0, slice.len());
        }
    }
}

/// Copies `data` into the guest `segments` from byte `skip` of them on.
fn write_segments(
    mem: &GuestMemoryMmap,
    segments: &[(GuestAddress, usize)],
    mut skip: usize,
    mut data: &[u8],
) -> Result<(), RequestError> {
    for &(addr, len) in segments {
        if data.is_empty() {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(data.len());
        mem.write_slice(&data[..n], addr.unchecked_add(skip as u64))
            .map_err(|_| RequestError::BadWritableBuffer)?;
        data = &data[n..];
        skip = 0;
    }
    Ok(())
}

/// Parses the request in `chain` and starts it ([`Request::start`]); a
/// malformed chain is completed at once. The first half of the
/// device-side handling of one chain (the second is [`PendingIo::finish`]
/// or [`Request::execute`]; its [`Processed`] says what the statistics
/// count).
pub fn begin<'a, M>(
    chain: DescriptorChain<M>,
    mem: &'a GuestMemoryMmap,
    ctx: &RequestContext,
) -> Started<'a>
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    match Request::parse(chain, mem) {
        Ok(request) => request.start(mem, ctx),
        Err(malformed) => {
            tracing::debug!("virtio-blk: malformed request: {}", malformed.error);
            let completion = match malformed.status {
                Some(addr) => write_status(mem, addr, malformed.error.status(), 0),
                None => Completion {
                    status: None,
                    used_len: 0,
                    hold: None,
                },
            };
            Started::Done(Processed {
                completion,
                kind: RequestKind::Other,
                outcome: Outcome::Invalid,
                bytes: 0,
            })
        }
    }
}

/// Parses and runs the request in `chain`, whatever it holds, on this
/// thread, through the same steps as the device ([`begin`], the op run
/// with the threads engine's blocking calls, [`PendingIo::finish`]). The
/// entry point of the `block_request` fuzz target and the reference the
/// engines' tests compare with; [`process_chain_counted`] also says what
/// the statistics count.
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
    match begin(chain, mem, ctx) {
        Started::Done(processed) => processed,
        Started::Io(pending, mut op) => {
            let result = run_blocking(&mut op, ctx.disk, 0);
            pending.finish(op, result, mem, ctx)
        }
        Started::Alone(request) => request.execute_counted(mem, ctx, scratch),
    }
}

/// Whether a write failed for want of space (the device, a quota, the
/// file size limit) rather than for an I/O error.
fn is_out_of_space(result: &std::io::Result<usize>) -> bool {
    matches!(
        result.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

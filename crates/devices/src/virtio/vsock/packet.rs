//! The virtio-vsock packet header (virtio 1.2 §5.10.6), little-endian on
//! the wire, parsed into plain fields (no unsafe casts).

/// Bytes of a `struct virtio_vsock_hdr`.
pub const HDR_LEN: usize = 44;

/// The host's CID (VMADDR_CID_HOST).
pub const HOST_CID: u64 = 2;

/// `type`: a stream socket (the only type we serve).
pub const TYPE_STREAM: u16 = 1;

/// `op` values.
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN `flags`: the sender will receive / send no more data.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;

/// Largest payload a driver may put in one packet (Linux's
/// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); bigger `len`s are malformed.
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;

/// A packet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VsockHeader {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl VsockHeader {
    /// Parses the wire form.
    pub fn from_bytes(b: &[u8; HDR_LEN]) -> VsockHeader {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        VsockHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// A name for an op, for logs.
pub fn op_name(op: u16) -> &'static str {
    match op {
        OP_REQUEST => "REQUEST",
        OP_RESPONSE => "RESPONSE",
        OP_RST => "RST",
        OP_SHUTDOWN => "SHUTDOWN",
        OP_RW => "RW",
        OP_CREDIT_UPDATE => "CREDIT_UPDATE",
        OP_CREDIT_REQUEST => "CREDIT_REQUEST",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_in_wire_order() {
        let h = VsockHeader {
            src_cid: 3,
            dst_cid: 2,
            src_port: 0x1122_3344,
            dst_port: 52,
            len: 5,
            type_: TYPE_STREAM,
            op: OP_RW,
            flags: 0,
            buf_alloc: 0x40000,
            fwd_cnt: 7,
        };
        let b = h.to_bytes();
        assert_eq!(&b[0..8], &3u64.to_le_bytes());
        assert_eq!(&b[16..20], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[28..32], &[1, 0, 5, 0]);
        assert_eq!(VsockHeader::from_bytes(&b), h);
    }
}

//! CopyRect encoding (RFC 6143 7.7.2): the rectangle's new content is the
//! client's own pixels at (src_x, src_y). The rectangle header carries the
//! destination; the data is just the source position.

/// Appends the CopyRect data.
pub fn encode(src_x: u16, src_y: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&src_x.to_be_bytes());
    out.extend_from_slice(&src_y.to_be_bytes());
}

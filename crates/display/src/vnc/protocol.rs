//! RFB wire messages (RFC 6143 sections 7.1 to 7.6): parsing what clients
//! send, serializing what the server sends. No I/O here: parsers take the
//! bytes received so far and say how many they used, so the session can be
//! driven by a non-blocking socket.

use super::pixel_format::PixelFormat;
use crate::geometry::Rect;

/// The version this server offers.
pub const SERVER_VERSION: &[u8; 12] = b"RFB 003.008\n";

/// Length of a ProtocolVersion message.
pub const VERSION_LEN: usize = 12;

/// The protocol version agreed with a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V3_3,
    V3_7,
    V3_8,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V3_3 => "3.3",
            Version::V3_7 => "3.7",
            Version::V3_8 => "3.8",
        })
    }
}

/// Reads a client's ProtocolVersion ("RFB xxx.yyy\n"). `None` means it is
/// not an RFB 3.x version string at all. Minor versions other than 7 and 8
/// are read as 3.3, as RFC 6143 7.1.1 asks: such peers do not implement the
/// later handshakes.
pub fn parse_version(b: &[u8; VERSION_LEN]) -> Option<Version> {
    if &b[0..4] != b"RFB " || b[7] != b'.' || b[11] != b'\n' {
        return None;
    }
    let number = |digits: &[u8]| -> Option<u32> {
        digits.iter().try_fold(0u32, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
        })
    };
    let major = number(&b[4..7])?;
    let minor = number(&b[8..11])?;
    if major != 3 {
        return None;
    }
    Some(match minor {
        7 => Version::V3_7,
        8 => Version::V3_8,
        _ => Version::V3_3,
    })
}

/// Security types (RFC 6143 7.1.2).
pub mod security {
    pub const NONE: u8 = 1;
    pub const VNC_AUTH: u8 = 2;
}

/// SecurityResult values (RFC 6143 7.1.3).
pub const SECURITY_OK: u32 = 0;
pub const SECURITY_FAILED: u32 = 1;

/// Encoding numbers (RFC 6143 7.7).
pub mod encoding {
    pub const RAW: i32 = 0;
    pub const COPY_RECT: i32 = 1;
    pub const ZRLE: i32 = 16;
}

/// Client-to-server message types (RFC 6143 7.5).
mod client_type {
    pub const SET_PIXEL_FORMAT: u8 = 0;
    pub const SET_ENCODINGS: u8 = 2;
    pub const FRAMEBUFFER_UPDATE_REQUEST: u8 = 3;
    pub const KEY_EVENT: u8 = 4;
    pub const POINTER_EVENT: u8 = 5;
    pub const CLIENT_CUT_TEXT: u8 = 6;
}

/// Server-to-client message type of FramebufferUpdate (RFC 6143 7.6.1).
const FRAMEBUFFER_UPDATE: u8 = 0;

/// A decoded client-to-server message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientMessage {
    SetPixelFormat(PixelFormat),
    SetEncodings(Vec<i32>),
    FramebufferUpdateRequest {
        incremental: bool,
        area: Rect,
    },
    KeyEvent {
        down: bool,
        keysym: u32,
    },
    PointerEvent {
        buttons: u8,
        x: u16,
        y: u16,
    },
    /// Only the header: `len` bytes of text follow, which the session skips
    /// as they arrive instead of buffering them.
    ClientCutText {
        len: u32,
    },
}

/// Decodes one message from the front of `buf`: `Ok(None)` when more bytes
/// are needed, `Ok(Some((message, bytes used)))`, or `Err` for a message
/// type this server does not know (the stream cannot be resynchronised
/// past one, so the caller must close).
pub fn parse_client_message(buf: &[u8]) -> Result<Option<(ClientMessage, usize)>, String> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    let need = |n: usize| buf.len() >= n;
    let u16_at = |i: usize| u16::from_be_bytes([buf[i], buf[i + 1]]);
    let u32_at = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let parsed = match kind {
        client_type::SET_PIXEL_FORMAT => {
            const LEN: usize = 4 + PixelFormat::WIRE_LEN;
            if !need(LEN) {
                return Ok(None);
            }
            let mut wire = [0u8; PixelFormat::WIRE_LEN];
            wire.copy_from_slice(&buf[4..LEN]);
            (
                ClientMessage::SetPixelFormat(PixelFormat::from_wire(&wire)),
                LEN,
            )
        }
        client_type::SET_ENCODINGS => {
            if !need(4) {
                return Ok(None);
            }
            let count = usize::from(u16_at(2));
            let len = 4 + 4 * count;
            if !need(len) {
                return Ok(None);
            }
            let list = buf[4..len]
                .chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (ClientMessage::SetEncodings(list), len)
        }
        client_type::FRAMEBUFFER_UPDATE_REQUEST => {
            if !need(10) {
                return Ok(None);
            }
            let area = Rect::new(u16_at(2), u16_at(4), u16_at(6), u16_at(8));
            let incremental = buf[1] != 0;
            (
                ClientMessage::FramebufferUpdateRequest { incremental, area },
                10,
            )
        }
        client_type::KEY_EVENT => {
            if !need(8) {
                return Ok(None);
            }
            let down = buf[1] != 0;
            (
                ClientMessage::KeyEvent {
                    down,
                    keysym: u32_at(4),
                },
                8,
            )
        }
        client_type::POINTER_EVENT => {
            if !need(6) {
                return Ok(None);
            }
            let msg = ClientMessage::PointerEvent {
                buttons: buf[1],
                x: u16_at(2),
                y: u16_at(4),
            };
            (msg, 6)
        }
        client_type::CLIENT_CUT_TEXT => {
            if !need(8) {
                return Ok(None);
            }
            (ClientMessage::ClientCutText { len: u32_at(4) }, 8)
        }
        other => return Err(format!("unknown client message type {other}")),
    };
    Ok(Some(parsed))
}

/// Appends a ServerInit message (RFC 6143 7.3.2).
pub fn put_server_init(
    out: &mut Vec<u8>,
    width: u16,
    height: u16,
    format: &PixelFormat,
    name: &str,
) {
    out.extend_from_slice(&width.to_be_bytes());
    out.extend_from_slice(&height.to_be_bytes());
    out.extend_from_slice(&format.to_wire());
    put_string(out, name);
}

/// Appends a u32 length and the bytes of `s` (the spec's STRING; names
/// and failure reasons).
pub fn put_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    // Only our own short strings get here; cap anyway so the length can
    // never lie.
    let bytes = &bytes[..bytes.len().min(u32::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Appends the header of a FramebufferUpdate with `rects` rectangles.
pub fn put_update_header(out: &mut Vec<u8>, rects: u16) {
    out.push(FRAMEBUFFER_UPDATE);
    out.push(0);
    out.extend_from_slice(&rects.to_be_bytes());
}

/// Appends a rectangle header; the encoding's data follows.
pub fn put_rect_header(out: &mut Vec<u8>, r: &Rect, encoding: i32) {
    for v in [r.x, r.y, r.w, r.h] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&encoding.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version(b"RFB 003.008\n"), Some(Version::V3_8));
        assert_eq!(parse_version(b"RFB 003.007\n"), Some(Version::V3_7));
        assert_eq!(parse_version(b"RFB 003.003\n"), Some(Version::V3_3));
        // Apple's and others' odd minors are 3.3 per the spec.
        assert_eq!(parse_version(b"RFB 003.889\n"), Some(Version::V3_3));
        assert_eq!(parse_version(b"RFB 003.005\n"), Some(Version::V3_3));
        assert_eq!(parse_version(b"RFB 004.000\n"), None);
        assert_eq!(parse_version(b"GET / HTTP/1"), None);
        assert_eq!(parse_version(b"RFB 00x.008\n"), None);
        assert_eq!(parse_version(b"RFB 003.008\r"), None);
    }

    #[test]
    fn parses_every_message_and_waits_for_more() {
        let msgs: Vec<(Vec<u8>, ClientMessage)> = vec![
            (
                [&[0u8, 0, 0, 0][..], &PixelFormat::SERVER.to_wire()].concat(),
                ClientMessage::SetPixelFormat(PixelFormat::SERVER),
            ),
            (
                vec![2, 0, 0, 2, 0, 0, 0, 16, 0xff, 0xff, 0xff, 0x21],
                ClientMessage::SetEncodings(vec![16, -223]),
            ),
            (
                vec![3, 1, 0, 1, 0, 2, 0, 3, 0, 4],
                ClientMessage::FramebufferUpdateRequest {
                    incremental: true,
                    area: Rect::new(1, 2, 3, 4),
                },
            ),
            (
                vec![4, 1, 0, 0, 0, 0, 0xff, 0x0d],
                ClientMessage::KeyEvent {
                    down: true,
                    keysym: 0xff0d,
                },
            ),
            (
                vec![5, 3, 1, 0, 0, 9],
                ClientMessage::PointerEvent {
                    buttons: 3,
                    x: 256,
                    y: 9,
                },
            ),
            (
                vec![6, 0, 0, 0, 0, 0, 0, 5],
                ClientMessage::ClientCutText { len: 5 },
            ),
        ];
        for (bytes, want) in msgs {
            for cut in 0..bytes.len() {
                assert_eq!(parse_client_message(&bytes[..cut]), Ok(None), "{want:?}");
            }
            let mut longer = bytes.clone();
            longer.push(0xaa);
            assert_eq!(parse_client_message(&longer), Ok(Some((want, bytes.len()))));
        }
        assert!(parse_client_message(&[7]).is_err());
        assert!(parse_client_message(&[255, 0, 0]).is_err());
    }
}

//! Rectangle encodings (RFC 6143 7.7): which one a client gets, and the
//! encoders themselves.

pub mod copyrect;
pub mod raw;
pub mod zrle;

use super::protocol::encoding;

/// The encodings this server sends changed pixels in. CopyRect is not
/// one: it carries no pixels and is only used for [`copy`] notifications.
///
/// [`copy`]: super::VncServer::copy
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelEncoding {
    Raw,
    Zrle,
}

impl PixelEncoding {
    /// The first encoding in the client's SetEncodings list (its order of
    /// preference) that this server implements. Raw when there is none:
    /// every client must accept Raw (RFC 6143 7.7.1).
    pub fn preferred(client_list: &[i32]) -> PixelEncoding {
        client_list
            .iter()
            .find_map(|&e| match e {
                encoding::RAW => Some(PixelEncoding::Raw),
                encoding::ZRLE => Some(PixelEncoding::Zrle),
                _ => None,
            })
            .unwrap_or(PixelEncoding::Raw)
    }

    /// The number that goes in a rectangle header.
    pub fn number(self) -> i32 {
        match self {
            PixelEncoding::Raw => encoding::RAW,
            PixelEncoding::Zrle => encoding::ZRLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_client_order() {
        assert_eq!(PixelEncoding::preferred(&[]), PixelEncoding::Raw);
        assert_eq!(PixelEncoding::preferred(&[7, 16, 0]), PixelEncoding::Zrle);
        assert_eq!(PixelEncoding::preferred(&[1, 0, 16]), PixelEncoding::Raw);
        assert_eq!(PixelEncoding::preferred(&[-223, 5]), PixelEncoding::Raw);
    }
}

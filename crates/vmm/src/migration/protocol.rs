//! The migration stream: framed, checksummed messages over one TCP
//! connection, both ways.
//!
//! ```text
//! frame    tag u8 | payload length u32 | CRC32 of the payload u32 | payload
//! ```
//!
//! All integers are little-endian; CRC32 is the IEEE polynomial. A frame
//! whose checksum does not match, whose tag is unknown or whose payload is
//! longer than [`MAX_PAYLOAD`] ends the migration with a one-line error:
//! nothing from a damaged stream reaches guest memory.
//!
//! Source → destination: `Hello`, `Pages`, `Zero`, `Postcopy`,
//! `Checksums`, `State`, `Done`. Destination → source: `Welcome`, `Refused`, `Request`,
//! `Running`, `Complete`, `Received` (after a resume).

use std::io::{self, Read, Write};

/// The protocol's version; both sides must speak the same.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest payload a frame may carry: a run of [`MAX_RUN_PAGES`] pages
/// and its header, or the largest state document, with room to spare.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Guest page size as the stream counts pages.
pub const PAGE_SIZE: usize = 4096;

/// The most pages one `Pages` frame carries.
pub const MAX_RUN_PAGES: usize = 256;

/// Why a page is on its way: the destination counts each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// Sent by a precopy round (before the destination runs).
    Precopy = 0,
    /// The page a destination fault asked for.
    Demand = 1,
    /// A neighbour of a demanded page (±N).
    Prefetch = 2,
    /// The background push of everything not yet sent.
    Background = 3,
}

impl PageKind {
    fn from_u8(v: u8) -> Option<PageKind> {
        Some(match v {
            0 => PageKind::Precopy,
            1 => PageKind::Demand,
            2 => PageKind::Prefetch,
            3 => PageKind::Background,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            PageKind::Precopy => "precopy",
            PageKind::Demand => "demand",
            PageKind::Prefetch => "prefetch",
            PageKind::Background => "background",
        }
    }
}

/// One message of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Source → destination, first: who is speaking and what machine the
    /// state is for (JSON, see `migration::Hello`).
    Hello(Vec<u8>),
    /// Destination → source: the machine matches; go on. Carries the
    /// destination's own view (JSON) for the source's log.
    Welcome(Vec<u8>),
    /// Destination → source: it will not take this VM, and why.
    Refused(String),
    /// A run of `count` pages from guest page `first` (guest-physical
    /// address / 4096), their bytes back to back.
    Pages {
        kind: PageKind,
        first: u64,
        data: Vec<u8>,
    },
    /// `count` pages from guest page `first` are all zero.
    Zero {
        kind: PageKind,
        first: u64,
        count: u32,
    },
    /// Source → destination: switching to postcopy. The pages listed (runs
    /// of `(first, count)`) were sent earlier but changed since: the
    /// destination drops its copies and will fault them in again.
    Postcopy { discard: Vec<(u64, u32)> },
    /// Source → destination, with `--verify-pages`, once the guest is
    /// stopped and before its state: the CRC32 of every page of RAM, in
    /// RAM order, as the destination must end up with it.
    Checksums(Vec<u32>),
    /// Source → destination: CPU and device state (JSON), after every page
    /// of a precopy or the discard list of a postcopy.
    State(Vec<u8>),
    /// Source → destination: every page has been sent.
    Done,
    /// Destination → source: send the page(s) from guest page `first`.
    Request { first: u64, count: u32 },
    /// Destination → source: the VM runs here now (wall-clock time, ns
    /// since the Unix epoch, when the vCPUs started).
    Running { at_unix_ns: u64 },
    /// Destination → source: every page has arrived; the source may let go.
    Complete,
    /// Destination → source, after a resumed connection: which pages it
    /// has (a bitmap, one bit per guest page of RAM in stream order).
    Received(Vec<u8>),
}

const TAG_HELLO: u8 = 1;
const TAG_WELCOME: u8 = 2;
const TAG_REFUSED: u8 = 3;
const TAG_PAGES: u8 = 4;
const TAG_ZERO: u8 = 5;
const TAG_POSTCOPY: u8 = 6;
const TAG_STATE: u8 = 7;
const TAG_DONE: u8 = 8;
const TAG_REQUEST: u8 = 9;
const TAG_RUNNING: u8 = 10;
const TAG_COMPLETE: u8 = 11;
const TAG_RECEIVED: u8 = 12;
const TAG_CHECKSUMS: u8 = 13;

/// What went wrong reading or writing the stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the connection closed")]
    Closed,
    /// The stream ended part-way through a frame: the connection broke
    /// while a frame was on the wire (a cut link ends a frame anywhere).
    #[error("the connection ended inside a frame{0}")]
    Truncated(&'static str),
    #[error("corrupt migration stream: {0}")]
    Corrupt(String),
}

impl StreamError {
    /// The peer went away (closed, reset, or the link broke), as opposed to
    /// sending something wrong: postcopy pauses and waits for a resume.
    pub fn is_disconnect(&self) -> bool {
        match self {
            StreamError::Closed | StreamError::Truncated(_) => true,
            StreamError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::NotConnected
            ),
            StreamError::Corrupt(_) => false,
        }
    }
}

fn corrupt(what: impl Into<String>) -> StreamError {
    StreamError::Corrupt(what.into())
}

impl Message {
    /// The frame's tag and payload.
    fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            Message::Hello(json) => (TAG_HELLO, json.clone()),
            Message::Welcome(json) => (TAG_WELCOME, json.clone()),
            Message::Refused(why) => (TAG_REFUSED, why.as_bytes().to_vec()),
            Message::Pages { kind, first, data } => {
                let mut p = Vec::with_capacity(9 + data.len());
                p.push(*kind as u8);
                p.extend_from_slice(&first.to_le_bytes());
                p.extend_from_slice(data);
                (TAG_PAGES, p)
            }
            Message::Zero { kind, first, count } => {
                let mut p = Vec::with_capacity(13);
                p.push(*kind as u8);
                p.extend_from_slice(&first.to_le_bytes());
                p.extend_from_slice(&count.to_le_bytes());
                (TAG_ZERO, p)
            }
            Message::Postcopy { discard } => {
                let mut p = Vec::with_capacity(4 + 12 * discard.len());
                p.extend_from_slice(&(discard.len() as u32).to_le_bytes());
                for (first, count) in discard {
                    p.extend_from_slice(&first.to_le_bytes());
                    p.extend_from_slice(&count.to_le_bytes());
                }
                (TAG_POSTCOPY, p)
            }
            Message::Checksums(crcs) => (
                TAG_CHECKSUMS,
                crcs.iter().flat_map(|c| c.to_le_bytes()).collect(),
            ),
            Message::State(json) => (TAG_STATE, json.clone()),
            Message::Done => (TAG_DONE, Vec::new()),
            Message::Request { first, count } => {
                let mut p = Vec::with_capacity(12);
                p.extend_from_slice(&first.to_le_bytes());
                p.extend_from_slice(&count.to_le_bytes());
                (TAG_REQUEST, p)
            }
            Message::Running { at_unix_ns } => (TAG_RUNNING, at_unix_ns.to_le_bytes().to_vec()),
            Message::Complete => (TAG_COMPLETE, Vec::new()),
            Message::Received(bitmap) => (TAG_RECEIVED, bitmap.clone()),
        }
    }

    fn decode(tag: u8, payload: Vec<u8>) -> Result<Message, StreamError> {
        let u64_at = |p: &[u8], at: usize| -> u64 {
            u64::from_le_bytes(p[at..at + 8].try_into().expect("8 bytes"))
        };
        let u32_at = |p: &[u8], at: usize| -> u32 {
            u32::from_le_bytes(p[at..at + 4].try_into().expect("4 bytes"))
        };
        let exact = |len: usize, what: &str| -> Result<(), StreamError> {
            if payload.len() == len {
                Ok(())
            } else {
                Err(corrupt(format!(
                    "{what} frame of {} bytes, expected {len}",
                    payload.len()
                )))
            }
        };
        let kind = |v: u8| PageKind::from_u8(v).ok_or_else(|| corrupt(format!("page kind {v}")));
        Ok(match tag {
            TAG_HELLO => Message::Hello(payload),
            TAG_WELCOME => Message::Welcome(payload),
            TAG_REFUSED => Message::Refused(String::from_utf8_lossy(&payload).into_owned()),
            TAG_PAGES => {
                if payload.len() < 9 + PAGE_SIZE || !(payload.len() - 9).is_multiple_of(PAGE_SIZE) {
                    return Err(corrupt(format!("pages frame of {} bytes", payload.len())));
                }
                if (payload.len() - 9) / PAGE_SIZE > MAX_RUN_PAGES {
                    return Err(corrupt("pages frame with too many pages"));
                }
                let kind = kind(payload[0])?;
                let first = u64_at(&payload, 1);
                let mut data = payload;
                data.drain(..9);
                Message::Pages { kind, first, data }
            }
            TAG_ZERO => {
                exact(13, "zero")?;
                Message::Zero {
                    kind: kind(payload[0])?,
                    first: u64_at(&payload, 1),
                    count: u32_at(&payload, 9),
                }
            }
            TAG_POSTCOPY => {
                if payload.len() < 4 {
                    return Err(corrupt("short postcopy frame"));
                }
                let n = u32_at(&payload, 0) as usize;
                exact(4 + 12 * n, "postcopy")?;
                let discard = (0..n)
                    .map(|i| (u64_at(&payload, 4 + 12 * i), u32_at(&payload, 12 + 12 * i)))
                    .collect();
                Message::Postcopy { discard }
            }
            TAG_CHECKSUMS => {
                if !payload.len().is_multiple_of(4) {
                    return Err(corrupt(format!(
                        "checksums frame of {} bytes",
                        payload.len()
                    )));
                }
                Message::Checksums(
                    payload
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                )
            }
            TAG_STATE => Message::State(payload),
            TAG_DONE => {
                exact(0, "done")?;
                Message::Done
            }
            TAG_REQUEST => {
                exact(12, "request")?;
                Message::Request {
                    first: u64_at(&payload, 0),
                    count: u32_at(&payload, 8),
                }
            }
            TAG_RUNNING => {
                exact(8, "running")?;
                Message::Running {
                    at_unix_ns: u64_at(&payload, 0),
                }
            }
            TAG_COMPLETE => {
                exact(0, "complete")?;
                Message::Complete
            }
            TAG_RECEIVED => Message::Received(payload),
            other => return Err(corrupt(format!("unknown frame tag {other}"))),
        })
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "hello",
            Message::Welcome(_) => "welcome",
            Message::Refused(_) => "refused",
            Message::Pages { .. } => "pages",
            Message::Zero { .. } => "zero",
            Message::Postcopy { .. } => "postcopy",
            Message::Checksums(_) => "checksums",
            Message::State(_) => "state",
            Message::Done => "done",
            Message::Request { .. } => "request",
            Message::Running { .. } => "running",
            Message::Complete => "complete",
            Message::Received(_) => "received",
        }
    }
}

/// Writes one frame; returns the bytes put on the wire.
pub fn write_message(out: &mut impl Write, message: &Message) -> Result<usize, StreamError> {
    let (tag, payload) = message.encode();
    let mut header = [0u8; 9];
    header[0] = tag;
    header[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[5..9].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.write_all(&header)?;
    out.write_all(&payload)?;
    Ok(header.len() + payload.len())
}

/// Reads one frame; `Closed` if the stream ended cleanly before it.
pub fn read_message(input: &mut impl Read) -> Result<(Message, usize), StreamError> {
    let mut header = [0u8; 9];
    let mut got = 0;
    while got < header.len() {
        match input.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(StreamError::Closed),
            Ok(0) => return Err(StreamError::Truncated(" header")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let tag = header[0];
    let len = u32::from_le_bytes(header[1..5].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[5..9].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(corrupt(format!("a frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len];
    input.read_exact(&mut payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            StreamError::Truncated("")
        } else {
            e.into()
        }
    })?;
    if crc32fast::hash(&payload) != crc {
        return Err(corrupt(format!("checksum mismatch in a frame (tag {tag})")));
    }
    Ok((Message::decode(tag, payload)?, header.len() + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(message: Message) {
        let mut wire = Vec::new();
        let n = write_message(&mut wire, &message).unwrap();
        assert_eq!(n, wire.len());
        let (back, m) = read_message(&mut wire.as_slice()).unwrap();
        assert_eq!(back, message);
        assert_eq!(m, n);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Message::Hello(b"{\"a\":1}".to_vec()));
        round_trip(Message::Welcome(b"{}".to_vec()));
        round_trip(Message::Refused("memory differs".into()));
        round_trip(Message::Pages {
            kind: PageKind::Prefetch,
            first: 0x1234,
            data: (0..2 * PAGE_SIZE).map(|i| i as u8).collect(),
        });
        round_trip(Message::Zero {
            kind: PageKind::Background,
            first: 7,
            count: 99,
        });
        round_trip(Message::Postcopy {
            discard: vec![(1, 2), (100, 1)],
        });
        round_trip(Message::Postcopy { discard: vec![] });
        round_trip(Message::Checksums(vec![0xdead_beef, 0, 7]));
        round_trip(Message::State(b"{}".to_vec()));
        round_trip(Message::Done);
        round_trip(Message::Request { first: 5, count: 1 });
        round_trip(Message::Running { at_unix_ns: 42 });
        round_trip(Message::Complete);
        round_trip(Message::Received(vec![0xff, 0x01]));
    }

    #[test]
    fn a_flipped_bit_is_found() {
        let mut wire = Vec::new();
        write_message(
            &mut wire,
            &Message::Pages {
                kind: PageKind::Demand,
                first: 3,
                data: vec![7u8; PAGE_SIZE],
            },
        )
        .unwrap();
        wire[100] ^= 0x10;
        let err = read_message(&mut wire.as_slice()).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        assert!(!err.is_disconnect());
    }

    #[test]
    fn truncation_and_garbage_are_errors_not_panics() {
        let mut wire = Vec::new();
        write_message(&mut wire, &Message::Request { first: 1, count: 1 }).unwrap();
        // A frame cut anywhere is the connection ending, which a postcopy
        // survives (it pauses), not a corrupt stream, which it does not.
        for cut in 1..wire.len() {
            let err = read_message(&mut &wire[..cut]).unwrap_err();
            assert!(err.is_disconnect(), "cut at {cut}: {err}");
        }
        assert!(matches!(
            read_message(&mut &[][..]),
            Err(StreamError::Closed)
        ));
        // An unknown tag with a valid checksum.
        let mut bad = vec![200u8, 0, 0, 0, 0];
        bad.extend_from_slice(&crc32fast::hash(&[]).to_le_bytes());
        assert!(read_message(&mut bad.as_slice()).is_err());
        // A huge length is refused before anything is allocated.
        let mut huge = vec![TAG_STATE];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(read_message(&mut huge.as_slice()).is_err());
        // Wrong sizes for fixed frames, and a page run that is not whole
        // pages, with valid checksums.
        for (tag, payload) in [
            (TAG_REQUEST, vec![0u8; 11]),
            (TAG_ZERO, vec![0u8; 12]),
            (TAG_PAGES, vec![0u8; 9 + 100]),
            (TAG_POSTCOPY, vec![5, 0, 0, 0]),
            (TAG_CHECKSUMS, vec![0u8; 7]),
            (TAG_ZERO, {
                let mut p = vec![9u8];
                p.extend_from_slice(&[0; 12]);
                p
            }),
        ] {
            let mut frame = vec![tag];
            frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            frame.extend_from_slice(&payload);
            assert!(
                read_message(&mut frame.as_slice()).is_err(),
                "tag {tag} with {} bytes",
                payload.len()
            );
        }
    }
}

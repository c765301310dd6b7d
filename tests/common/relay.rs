//! A TCP relay between a migration's source and its destination that does
//! to the stream what a broken or hostile network would: cuts it, resets
//! it, damages a frame (with its checksum made right again, or not), or
//! lets the test act (kill a side) when a given frame goes by.
//!
//! Source to destination, a relay with a frame [`Fault`] reads whole
//! frames (the protocol's own reader) and writes them again, so it can
//! find a page or the state in the stream; the other way, and with
//! the byte faults ([`Fault::None`], [`Fault::FlipStreamByte`],
//! [`Fault::CutAfter`], [`Fault::ResetAfter`]), bytes pass as they come.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vmm::migration::protocol::{read_message, write_message, Message};

/// What the relay does to the source's stream.
pub enum Fault {
    /// Nothing: it only relays, until [`Relay::cut`].
    None,
    /// Changes one byte of the last `pages` frame before the checksums or
    /// the state (the stop-and-copy's pages, which are not sent again), in
    /// a page no `zero` frame after it clears.
    /// `fix_crc`: the frame's CRC is computed again over the damaged
    /// payload, so only an end-to-end check can see it; otherwise the
    /// frame's own checksum no longer matches.
    FlipPageByte { fix_crc: bool },
    /// Changes the byte at this offset of the raw stream (inside TLS
    /// records, when the migration is over TLS).
    FlipStreamByte(u64),
    /// Once this many bytes came from the source: runs `then` (say, kill
    /// the destination), then cuts both connections.
    CutAfter {
        bytes: u64,
        then: Box<dyn FnOnce() + Send>,
    },
    /// Once this many bytes came from the source: resets both
    /// connections (an RST each way, as a middlebox or a peer's crash
    /// does), rather than closing them.
    ResetAfter(u64),
    /// When the first frame `name` (see `Message::name`) comes from the
    /// source, before it is passed on: runs `then`, then cuts both
    /// connections.
    CutAtFrame {
        name: &'static str,
        then: Box<dyn FnOnce() + Send>,
    },
}

/// A relay from a port of its own to the destination's.
pub struct Relay {
    pub port: u16,
    streams: Arc<Streams>,
}

/// The relay's two connections, for cutting or resetting them from any
/// thread.
#[derive(Default)]
struct Streams {
    open: Mutex<Vec<TcpStream>>,
    /// Set when they are reset: nothing may then close them gracefully.
    resetting: AtomicBool,
}

impl Relay {
    /// Relays the first connection to `port` of the loopback to `to`.
    pub fn start(to: u16, fault: Fault) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let streams = Arc::new(Streams::default());
        let kept = streams.clone();
        std::thread::spawn(move || {
            let (inbound, _) = listener.accept().unwrap();
            let outbound = TcpStream::connect(("127.0.0.1", to)).unwrap();
            kept.open
                .lock()
                .unwrap()
                .extend([inbound.try_clone().unwrap(), outbound.try_clone().unwrap()]);
            let (from_src, to_dst) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            let cut = kept.clone();
            std::thread::spawn(move || {
                forward(from_src, to_dst, fault, &cut);
            });
            std::thread::spawn(move || {
                let (mut from, mut into) = (outbound, inbound);
                let _ = std::io::copy(&mut from, &mut into);
                if !kept.resetting.load(Ordering::SeqCst) {
                    let _ = into.shutdown(Shutdown::Write);
                }
            });
        });
        Relay { port, streams }
    }

    /// Breaks both connections.
    pub fn cut(&self) {
        cut_all(&self.streams);
    }
}

fn cut_all(streams: &Streams) {
    for stream in streams.open.lock().unwrap().iter() {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

/// Resets both connections: SO_LINGER 0 makes the last close of each
/// socket send an RST instead of a FIN. The other direction's thread is
/// woken by a read shutdown (which sends nothing) and drops its copies
/// without closing gracefully; the caller drops its own.
fn reset_all(streams: &Streams) {
    streams.resetting.store(true, Ordering::SeqCst);
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    for stream in streams.open.lock().unwrap().drain(..) {
        // SAFETY: a valid socket of ours and a properly sized option.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
        let _ = stream.shutdown(Shutdown::Read);
    }
}

/// Passes bytes from `from` to `into` as they come, the byte at offset
/// `flip` (if any) changed, until `from` ends or, with `limit`, that many
/// bytes have passed. Returns whether the limit was reached.
fn pump(from: &mut TcpStream, into: &mut TcpStream, flip: Option<u64>, limit: Option<u64>) -> bool {
    let mut seen = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let left = limit.map_or(u64::MAX, |l| l - seen);
        if left == 0 {
            return true;
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        if let Some(at) = flip.filter(|at| (seen..seen + n as u64).contains(at)) {
            buf[(at - seen) as usize] ^= 0x5a;
        }
        seen += n as u64;
        if into.write_all(&buf[..n]).is_err() {
            return false;
        }
    }
}

/// Source to destination, with `fault`.
fn forward(mut from: TcpStream, mut into: TcpStream, fault: Fault, streams: &Streams) {
    match fault {
        Fault::None => {
            pump(&mut from, &mut into, None, None);
            let _ = into.shutdown(Shutdown::Write);
        }
        Fault::FlipStreamByte(at) => {
            pump(&mut from, &mut into, Some(at), None);
            let _ = into.shutdown(Shutdown::Write);
        }
        Fault::CutAfter { bytes, then } => {
            if pump(&mut from, &mut into, None, Some(bytes)) {
                then();
                cut_all(streams);
            }
        }
        Fault::ResetAfter(bytes) => {
            if pump(&mut from, &mut into, None, Some(bytes)) {
                reset_all(streams);
            }
        }
        Fault::FlipPageByte { fix_crc } => {
            // The latest pages frame and the zero frames after it are held
            // until the next frame shows whether they were the last before
            // the checksums or the state: a page damaged earlier might be
            // sent again, whole, in a later round, and a zero frame after
            // it might clear it (the stop-and-copy's last run is often
            // zero pages).
            let mut held: Vec<Message> = Vec::new();
            let mut done = false;
            while let Ok((message, _)) = read_message(&mut from) {
                let mut frame = Vec::new();
                match message {
                    Message::Pages { .. } => {
                        for m in held.drain(..) {
                            write_message(&mut frame, &m).unwrap();
                        }
                        held.push(message);
                    }
                    Message::Zero { .. } if !held.is_empty() => held.push(message),
                    Message::Checksums(_) | Message::State(_) if !done && !held.is_empty() => {
                        frame = damaged(std::mem::take(&mut held), fix_crc);
                        write_message(&mut frame, &message).unwrap();
                        done = true;
                    }
                    message => {
                        for m in held.drain(..) {
                            write_message(&mut frame, &m).unwrap();
                        }
                        write_message(&mut frame, &message).unwrap();
                    }
                }
                if into.write_all(&frame).is_err() {
                    break;
                }
            }
            let _ = into.shutdown(Shutdown::Write);
        }
        Fault::CutAtFrame { name, then } => {
            while let Ok((message, _)) = read_message(&mut from) {
                if message.name() == name {
                    then();
                    cut_all(streams);
                    return;
                }
                let mut frame = Vec::new();
                write_message(&mut frame, &message).unwrap();
                if into.write_all(&frame).is_err() {
                    break;
                }
            }
            let _ = into.shutdown(Shutdown::Write);
        }
    }
}

/// The frames `held` (a pages frame, then zero frames) encoded, with one
/// byte changed in the last page of the pages frame that no zero frame
/// after it clears; with `fix_crc`, the frame's CRC is computed over the
/// damaged payload.
fn damaged(held: Vec<Message>, fix_crc: bool) -> Vec<u8> {
    use vmm::migration::protocol::PAGE_SIZE;
    let mut frames = held.into_iter();
    let Some(Message::Pages {
        kind,
        first,
        mut data,
    }) = frames.next()
    else {
        panic!("the relay holds no pages frame");
    };
    let zeros: Vec<Message> = frames.collect();
    let cleared = |page: u64| {
        zeros.iter().any(|z| match z {
            Message::Zero { first, count, .. } => {
                (*first..*first + u64::from(*count)).contains(&page)
            }
            _ => false,
        })
    };
    let pages = (data.len() / PAGE_SIZE) as u64;
    let page = (0..pages)
        .rev()
        .find(|i| !cleared(first + i))
        .unwrap_or_else(|| {
            panic!("every page of the last pages frame (from {first}) is cleared after it")
        });
    let at = page as usize * PAGE_SIZE + 100;
    let mut out = Vec::new();
    if fix_crc {
        data[at] ^= 0x5a;
        write_message(&mut out, &Message::Pages { kind, first, data }).unwrap();
    } else {
        write_message(&mut out, &Message::Pages { kind, first, data }).unwrap();
        // The frame's 9-byte header, then the payload's own 9 (kind, first).
        out[9 + 9 + at] ^= 0x5a;
    }
    for z in &zeros {
        write_message(&mut out, z).unwrap();
    }
    out
}

//! The byte stream an RFB session runs over, and its plain TCP form.
//!
//! Sessions never block on a client: sockets are non-blocking, reads take
//! what has arrived, writes are queued and pushed out as the socket takes
//! them. That keeps one thread per client able both to read a client's
//! input while it is slow to read our updates (no deadlock when both sides
//! write at once) and to notice shutdown at any time.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

/// What a read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStatus {
    /// Everything that had arrived was taken.
    Drained,
    /// The byte budget ran out first: more may be waiting (possibly inside
    /// the transport's own buffers, invisible to poll), so read again
    /// before sleeping.
    More,
    /// The peer closed the stream.
    Closed,
}

/// A non-blocking, full-duplex byte stream to one client.
pub trait Transport: Send {
    /// The socket to poll for readiness.
    fn fd(&self) -> RawFd;

    /// Appends the bytes that have arrived (about `budget` at most) to
    /// `buf`, without blocking.
    fn read_available(&mut self, buf: &mut Vec<u8>, budget: usize) -> io::Result<ReadStatus>;

    /// Queues `data` to be sent, without blocking.
    fn queue(&mut self, data: Vec<u8>) -> io::Result<()>;

    /// Writes as much queued data as the socket takes now; `Ok(true)` when
    /// nothing remains queued.
    fn flush(&mut self) -> io::Result<bool>;

    /// Ends the connection (best effort: the peer may be gone already).
    fn close(&mut self);
}

/// Bytes per read call.
const READ_CHUNK: usize = 16 * 1024;

/// RFB straight over TCP.
pub struct TcpTransport {
    stream: TcpStream,
    /// Queued chunks; the first may be partly written already.
    out: VecDeque<Vec<u8>>,
    /// How much of the first chunk was written.
    written: usize,
}

impl TcpTransport {
    /// `stream` must already be non-blocking.
    pub fn new(stream: TcpStream) -> TcpTransport {
        TcpTransport {
            stream,
            out: VecDeque::new(),
            written: 0,
        }
    }
}

impl Transport for TcpTransport {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn read_available(&mut self, buf: &mut Vec<u8>, budget: usize) -> io::Result<ReadStatus> {
        let mut taken = 0;
        let mut chunk = [0u8; READ_CHUNK];
        while taken < budget {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(ReadStatus::Closed),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    taken += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(ReadStatus::Drained),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ReadStatus::More)
    }

    fn queue(&mut self, data: Vec<u8>) -> io::Result<()> {
        if !data.is_empty() {
            self.out.push_back(data);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<bool> {
        while let Some(front) = self.out.front() {
            match self.stream.write(&front[self.written..]) {
                Ok(0) => return Err(io::Error::new(ErrorKind::WriteZero, "socket took no bytes")),
                Ok(n) => {
                    self.written += n;
                    if self.written == front.len() {
                        self.out.pop_front();
                        self.written = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn close(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

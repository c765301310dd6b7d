//! Entry point for the fuzz target in `fuzz/` (not an API): guest
//! packets through the tx path the device's worker takes, into a muxer
//! joined to real host Unix sockets.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;

use vmm_sys_util::epoll::{Epoll, EpollEvent};

use super::handler::{handle_packet, ReaderLen};
use super::muxer::VsockMuxer;
use super::packet::{HOST_CID, MAX_PKT_PAYLOAD};
use super::VsockMetrics;

/// The guest's CID in the fuzzed device.
pub const GUEST_CID: u64 = 3;
/// A host port something listens on (`<uds>_1234`), so guest connection
/// requests to it succeed.
pub const LISTENING_PORT: u32 = 1234;

/// One tx chain's readable bytes.
struct Chain<'a>(&'a [u8]);

impl Read for Chain<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl ReaderLen for Chain<'_> {
    fn remaining(&self) -> usize {
        self.0.len()
    }
}

/// Feeds `input` to a vsock device's muxer as the guest's tx chains, each
/// a little-endian u16 length and that many bytes (header, then payload),
/// handled as the worker handles a chain; after each, host socket events
/// are handled and the rx packets the guest would get are taken. A host
/// program has connected asking for guest port 5000 beforehand. Returns
/// the ops of the packets to the guest; panics if one is not from the
/// host to the guest, or its payload is not what its header says.
pub fn tx_packets(dir: &std::path::Path, mut input: &[u8]) -> io::Result<Vec<u16>> {
    let uds = dir.join("vsock.sock");
    let _ = std::fs::remove_file(&uds);
    let port_path = PathBuf::from(format!("{}_{LISTENING_PORT}", uds.display()));
    let _ = std::fs::remove_file(&port_path);
    let listener = UnixListener::bind(&uds)?;
    let _host_service = UnixListener::bind(&port_path)?;
    let mut host_program = UnixStream::connect(&uds)?;
    host_program.write_all(b"CONNECT 5000\n")?;
    let mut muxer = VsockMuxer::new(
        GUEST_CID,
        uds,
        listener,
        Epoll::new()?,
        Arc::new(VsockMetrics::default()),
    )?;
    let mut buf = vec![0u8; MAX_PKT_PAYLOAD];
    let mut events = [EpollEvent::default(); 16];
    let mut to_guest = Vec::new();
    loop {
        let ready = muxer.epoll().wait(0, &mut events[..])?;
        for event in &events[..ready] {
            muxer.handle_event(event.data(), event.event_set());
        }
        // The guest's rx buffers: 4 KiB each, a bounded number per turn.
        for _ in 0..64 {
            if !muxer.has_rx() {
                break;
            }
            let Some((hdr, payload)) = muxer.next_rx(4096) else {
                break;
            };
            assert_eq!((hdr.src_cid, hdr.dst_cid), (HOST_CID, GUEST_CID), "{hdr:?}");
            assert_eq!(hdr.len as usize, payload.len(), "{hdr:?}");
            assert!(payload.len() <= 4096, "{hdr:?}");
            to_guest.push(hdr.op);
        }
        let Some((len, rest)) = input.split_first_chunk::<2>() else {
            return Ok(to_guest);
        };
        let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
        let (chain, rest) = rest.split_at(len);
        input = rest;
        handle_packet(&mut muxer, &mut buf, &mut Chain(chain));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::vsock::packet::*;

    fn chain(op: u16, dst_port: u32) -> Vec<u8> {
        let hdr = VsockHeader {
            src_cid: GUEST_CID,
            dst_cid: HOST_CID,
            src_port: 1025,
            dst_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: 65536,
            ..VsockHeader::default()
        };
        let mut out = (HDR_LEN as u16).to_le_bytes().to_vec();
        out.extend_from_slice(&hdr.to_bytes());
        out
    }

    #[test]
    fn guest_requests_are_answered_as_the_host_sockets_say() {
        let dir = std::env::temp_dir().join(format!("hk-vsock-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The host program's CONNECT reaches the guest as a request.
        assert!(tx_packets(&dir, &[]).unwrap().contains(&OP_REQUEST));
        // A listening host port accepts; another resets.
        let ops = tx_packets(&dir, &chain(OP_REQUEST, LISTENING_PORT)).unwrap();
        assert!(ops.contains(&OP_RESPONSE), "{ops:?}");
        let ops = tx_packets(&dir, &chain(OP_REQUEST, 4321)).unwrap();
        assert!(
            ops.contains(&OP_RST) && !ops.contains(&OP_RESPONSE),
            "{ops:?}"
        );
        // A chain shorter than its header is dropped, unanswered.
        let ops = tx_packets(&dir, &chain(OP_REQUEST, LISTENING_PORT)[..20]).unwrap();
        assert!(!ops.contains(&OP_RESPONSE), "{ops:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

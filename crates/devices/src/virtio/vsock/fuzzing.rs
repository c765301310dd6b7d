//! Entry points for the fuzz targets in `fuzz/` (not an API): guest
//! packets through the tx path the device's worker takes, into a muxer
//! joined to real host Unix sockets (`tx_packets`); and the whole
//! worker, its rx, tx and event queues laid out from the input, corrupt
//! as they like, over a small guest memory with a hole (`queues`).

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vmm_sys_util::epoll::{Epoll, EpollEvent};

use super::handler::{handle_packet, ReaderLen, VsockHandler};
use super::muxer::VsockMuxer;
use super::packet::{HDR_LEN, HOST_CID, MAX_PKT_PAYLOAD};
use super::{VsockMetrics, EVENT_QUEUE, QUEUE_SIZE, RX_QUEUE, TX_QUEUE};
use crate::virtio::fuzzing::{
    guest_memory, rings_from, write_data, CountingInterrupt, Input, Ring, RING_SIZE,
};

/// The guest's CID in the fuzzed device.
pub const GUEST_CID: u64 = 3;
/// A host port something listens on (`<uds>_1234`), so guest connection
/// requests to it succeed.
pub const LISTENING_PORT: u32 = 1234;

/// The host side of a fuzzed device: its muxer, a host program that has
/// connected asking for guest port 5000, and a service listening on host
/// port [`LISTENING_PORT`] for the guest's requests.
struct Host {
    muxer: VsockMuxer,
    metrics: Arc<VsockMetrics>,
    program: UnixStream,
    service: UnixListener,
}

impl Host {
    /// The sockets live in `dir` (one per fuzzing process: a run
    /// replaces the last one's).
    fn new(dir: &std::path::Path) -> io::Result<Host> {
        let uds = dir.join("vsock.sock");
        let _ = std::fs::remove_file(&uds);
        let port_path = PathBuf::from(format!("{}_{LISTENING_PORT}", uds.display()));
        let _ = std::fs::remove_file(&port_path);
        let listener = UnixListener::bind(&uds)?;
        let service = UnixListener::bind(&port_path)?;
        let mut program = UnixStream::connect(&uds)?;
        program.write_all(b"CONNECT 5000\n")?;
        let metrics = Arc::new(VsockMetrics::default());
        let muxer = VsockMuxer::new(GUEST_CID, uds, listener, Epoll::new()?, metrics.clone())?;
        Ok(Host {
            muxer,
            metrics,
            program,
            service,
        })
    }
}

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
    let Host {
        mut muxer,
        program: _program,
        service: _service,
        ..
    } = Host::new(dir)?;
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

/// Input byte 0: the driver accepted VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u8 = 1;
/// Input byte 0: the device was restored and owes the guest a
/// TRANSPORT_RESET on the event queue.
pub const RESTORED: u8 = 2;
/// What an event byte asks for (mod 5).
pub const EVENT_TX_KICK: u8 = 0;
pub const EVENT_RX_KICK: u8 = 1;
pub const EVENT_EVENT_KICK: u8 = 2;
/// The host sockets' events are handled (and deadlines expired).
pub const EVENT_HOST_TURN: u8 = 3;
/// The host program writes [`HOST_WRITE`] bytes to its stream.
pub const EVENT_HOST_WRITE: u8 = 4;
/// Bytes the host program writes at a time.
pub const HOST_WRITE: usize = 3000;

/// Runs `input` through the vsock worker's handler, as its loop would,
/// with real host sockets ([`Host`]). Layout:
/// - byte 0: [`EVENT_IDX`], [`RESTORED`];
/// - the rx, tx and event queues, [`RING_INPUT_LEN`] bytes each
///   ([`Ring::write_from`]);
/// - a byte n (mod 32), then n events (mod 5: [`EVENT_TX_KICK`] ...
///   [`EVENT_HOST_WRITE`]), handled in turn; each ends with the rx the
///   worker does after every wake-up;
/// - the rest: guest memory contents from
///   [`crate::virtio::fuzzing::DATA`] (the guest's packets).
///
/// When the device wrote nothing into guest memory but its used rings
/// (no rx packet, no event: buffers may lie over the rings), panics if a
/// queue's used ring names a chain the ring cannot have, if the device
/// uses more chains than a ring can offer (the available index goes at
/// most [`RING_SIZE`] past the device's), if a tx buffer is used with a
/// length, an event buffer with other than 0 or 4 bytes, or an rx buffer
/// with a length no packet has.
pub fn queues(dir: &std::path::Path, input: &[u8]) -> io::Result<QueuesOutcome> {
    let mut input = Input(input);
    let control = input.u8();
    let mem = guest_memory();
    let rings: [Ring; 3] = rings_from(&mem, &mut input);
    let events: Vec<u8> = {
        let n = usize::from(input.u8() % 32);
        input.bytes(n).iter().map(|&b| b % 5).collect()
    };
    write_data(&mem, &mut input);

    let Host {
        muxer,
        metrics,
        mut program,
        service: _service,
    } = Host::new(dir)?;
    program.set_nonblocking(true)?;
    let event_idx = control & EVENT_IDX != 0;
    let queue = |index: u16| rings[usize::from(index)].queue_events(index, QUEUE_SIZE, event_idx);
    let interrupt = Arc::new(CountingInterrupt::default());
    let mut handler = VsockHandler::new(
        mem.clone(),
        interrupt.clone(),
        queue(RX_QUEUE)?,
        queue(TX_QUEUE)?,
        queue(EVENT_QUEUE)?,
        muxer,
    );
    let restored = control & RESTORED != 0;
    if restored {
        handler.owe_transport_reset();
    }
    let mut ready = [EpollEvent::default(); 16];
    for &event in &events {
        match event {
            EVENT_TX_KICK => handler.process_tx(),
            EVENT_RX_KICK => {}
            EVENT_EVENT_KICK => handler.send_transport_reset(),
            EVENT_HOST_TURN => {
                let n = handler.muxer().epoll().wait(0, &mut ready[..])?;
                for e in &ready[..n] {
                    handler.muxer().handle_event(e.data(), e.event_set());
                }
                handler.muxer().expire(std::time::Instant::now());
            }
            _ => match program.write(&[b'h'; HOST_WRITE]) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            },
        }
        handler.process_rx();
    }

    // The used rings say what the device did only if it wrote nothing
    // else into guest memory: the guest may post its rx and event buffers
    // over the rings themselves (the Writer checks a whole chain before
    // writing, so an event went in exactly when none is owed any more).
    let wrote_guest_memory = metrics.rx_packets.load(Ordering::Relaxed) > 0
        || (restored && !handler.owes_transport_reset());
    let mut outcome = QueuesOutcome {
        rings_checked: !wrote_guest_memory,
        ..QueuesOutcome::default()
    };
    for (index, ring) in rings.iter().enumerate() {
        let used = ring.used_idx(&mem);
        outcome.used[index] = used;
        for (id, len) in ring.used_entries(&mem) {
            outcome.used_bytes[index] += len as usize;
            if !outcome.rings_checked {
                continue;
            }
            assert!(
                id < u32::from(RING_SIZE),
                "queue {index}: used ({id}, {len})"
            );
            let len = len as usize;
            match index as u16 {
                RX_QUEUE => assert!(
                    len == 0 || (HDR_LEN..=HDR_LEN + MAX_PKT_PAYLOAD).contains(&len),
                    "rx used ({id}, {len})"
                ),
                TX_QUEUE => assert_eq!(len, 0, "tx used ({id}, {len})"),
                _ => assert!(len == 0 || len == 4, "event used ({id}, {len})"),
            }
        }
        if outcome.rings_checked {
            assert!(used <= RING_SIZE, "queue {index}: {used} chains used");
        }
    }
    outcome.interrupts = interrupt.queue.load(Ordering::Relaxed);
    Ok(outcome)
}

/// What [`queues`] saw the device do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct QueuesOutcome {
    /// Chains used, per queue (rx, tx, event).
    pub used: [u16; 3],
    /// The lengths of those chains, summed per queue.
    pub used_bytes: [usize; 3],
    /// Queue interrupts raised.
    pub interrupts: usize,
    /// Whether the used rings were checked: only when the device wrote
    /// nothing else into guest memory (no rx packet, no event).
    pub rings_checked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::fuzzing::{ring_input, DATA};
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

    /// A chain: its descriptors' (address, length, flags).
    type Descriptors<'a> = &'a [(u64, u32, u16)];

    /// Input for [`queues`]: the control byte, the rx, tx and event rings
    /// (each a list of chains), the events, and guest memory from DATA.
    fn queues_input(
        control: u8,
        rings: [&[Descriptors]; 3],
        events: &[u8],
        data: &[u8],
    ) -> Vec<u8> {
        let mut out = vec![control];
        for chains in rings {
            out.extend_from_slice(&ring_input(chains));
        }
        out.push(events.len() as u8);
        out.extend_from_slice(events);
        out.extend_from_slice(data);
        out
    }

    const WRITE: u16 = 2;

    #[test]
    fn the_whole_device_serves_its_queues() {
        let dir = std::env::temp_dir().join(format!("hk-vsock-queues-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rx_buffer: &[(u64, u32, u16)] = &[(DATA + 0x1000, 4096, WRITE)];
        // The host program's request reaches the guest's rx buffer.
        let out = queues(
            &dir,
            &queues_input(
                0,
                [&[rx_buffer], &[], &[]],
                &[EVENT_HOST_TURN, EVENT_HOST_TURN],
                &[],
            ),
        )
        .unwrap();
        assert_eq!(
            (out.used, out.used_bytes[0]),
            ([1, 0, 0], HDR_LEN),
            "{out:?}"
        );
        assert!(out.interrupts > 0, "{out:?}");
        // A guest request to the listening host port, on tx, is used
        // without a length and answered on rx.
        let request = &chain(OP_REQUEST, LISTENING_PORT)[2..];
        let tx: &[(u64, u32, u16)] = &[(DATA, HDR_LEN as u32, 0)];
        let out = queues(
            &dir,
            &queues_input(0, [&[rx_buffer], &[tx], &[]], &[EVENT_TX_KICK], request),
        )
        .unwrap();
        assert_eq!(out.used, [1, 1, 0], "{out:?}");
        assert_eq!(out.used_bytes, [HDR_LEN, 0, 0], "{out:?}");
        // An rx chain with a readable descriptor is given back empty.
        let readable: &[(u64, u32, u16)] = &[(DATA + 0x1000, 4096, 0)];
        let out = queues(
            &dir,
            &queues_input(
                0,
                [&[readable], &[], &[]],
                &[EVENT_HOST_TURN, EVENT_HOST_TURN],
                &[],
            ),
        )
        .unwrap();
        assert_eq!(
            (out.used, out.used_bytes),
            ([1, 0, 0], [0, 0, 0]),
            "{out:?}"
        );
        // A restored device resets the transport in the first event
        // buffer that holds 4 bytes; a smaller one comes back empty.
        let small: &[(u64, u32, u16)] = &[(DATA + 0x2000, 2, WRITE)];
        let event: &[(u64, u32, u16)] = &[(DATA + 0x2000, 8, WRITE)];
        let kick = [EVENT_EVENT_KICK, EVENT_EVENT_KICK];
        let out = queues(
            &dir,
            &queues_input(RESTORED, [&[], &[], &[small, event]], &kick, &[]),
        )
        .unwrap();
        assert_eq!((out.used[2], out.used_bytes[2]), (2, 4), "{out:?}");
        let out = queues(&dir, &queues_input(0, [&[], &[], &[event]], &kick, &[])).unwrap();
        assert_eq!(out.used[2], 0, "no reset owed: {out:?}");
        assert!(out.rings_checked, "{out:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The fuzzer's find (CI, stop 31): the guest posts an rx buffer over
    /// the rx queue's own used ring, so the packet the device writes there
    /// reads back as a used entry of 3 bytes. The guest did that, not the
    /// device: the rings are not judged once packets went into memory.
    #[test]
    fn rx_buffers_over_the_rings_are_the_guests_doing() {
        let dir = std::env::temp_dir().join(format!("hk-vsock-overlap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rx_used_ring = crate::virtio::fuzzing::Ring::nth(u64::from(RX_QUEUE)).used;
        let rx_buffer: &[(u64, u32, u16)] = &[(DATA + 0x1000, 4096, WRITE)];
        let over_used: &[(u64, u32, u16)] = &[(rx_used_ring, 4096, WRITE)];
        let request = &chain(OP_REQUEST, LISTENING_PORT)[2..];
        let tx: &[(u64, u32, u16)] = &[(DATA, HDR_LEN as u32, 0)];
        // The host program's request goes into the first buffer; the
        // answer to the guest's own request into the second, whose header
        // overwrites the first used entry: (id 0, the guest's CID 3).
        let out = queues(
            &dir,
            &queues_input(
                0,
                [&[rx_buffer, over_used], &[tx], &[]],
                &[EVENT_HOST_TURN, EVENT_TX_KICK],
                request,
            ),
        )
        .unwrap();
        assert!(!out.rings_checked, "{out:?}");
        assert_eq!(
            (out.used[0], out.used_bytes[0]),
            (2, GUEST_CID as usize + HDR_LEN),
            "{out:?}"
        );
        // A restored device's event, written over the event ring, too.
        let event_used_ring = crate::virtio::fuzzing::Ring::nth(u64::from(EVENT_QUEUE)).used;
        let over_used: &[(u64, u32, u16)] = &[(event_used_ring, 8, WRITE)];
        let out = queues(
            &dir,
            &queues_input(RESTORED, [&[], &[], &[over_used]], &[EVENT_EVENT_KICK], &[]),
        )
        .unwrap();
        assert!(!out.rings_checked, "{out:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

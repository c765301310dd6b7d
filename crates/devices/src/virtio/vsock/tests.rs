//! virtio-vsock tests: the device driven through split queues in test
//! guest memory (`virtio::testing`, the guest side) and real Unix sockets
//! (the host side).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::connection::BUF_ALLOC;
use super::muxer::{CONNECT_TIMEOUT, MAX_PENDING_CONTROL};
use super::packet::*;
use super::*;
use crate::virtio::state::testing::{at_saved_position, through_json};
use crate::virtio::testing::{guest_memory, wait_until, DriverQueue, RecordingInterrupt, Used, D};
use crate::virtio::{
    ActivateError, Activation, DeviceState, StateError, VirtioDevice, COMMON_FEATURES,
};

const CID: u64 = 3;

/// A directory for sockets, removed at the end.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new() -> TmpDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "hkv-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TmpDir(p)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Rig {
    dev: Vsock,
    rx: DriverQueue,
    tx: DriverQueue,
    ev: DriverQueue,
    irq: Arc<RecordingInterrupt>,
    uds: PathBuf,
    /// rx buffers given to the device: head → (header addr, payload addr).
    rx_bufs: std::collections::HashMap<u16, (u64, u64)>,
    rx_payload: u32,
    _dir: TmpDir,
}

fn rig() -> Rig {
    rig_with(0, 4096, 16)
}

fn rig_with(acked: u64, rx_payload: u32, rx_count: usize) -> Rig {
    let dir = TmpDir::new();
    let uds = dir.0.join("v.sock");
    let mut dev =
        Vsock::from_options(&format!("cid={CID},uds={}", uds.display()), "vsock0").unwrap();
    let mem = guest_memory();
    let rx = DriverQueue::with_data(&mem, 0x1000, 256, 0x10_0000, 0xc0_0000);
    let tx = DriverQueue::with_data(&mem, 0x1_0000, 256, 0xd0_0000, 0xc0_0000);
    let ev = DriverQueue::with_data(&mem, 0x2_0000, 256, 0x1a0_0000, 0x10_0000);
    let irq = RecordingInterrupt::new();
    dev.activate(
        mem,
        irq.clone(),
        vec![rx.queue_events(0), tx.queue_events(1), ev.queue_events(2)],
        COMMON_FEATURES | acked,
    )
    .unwrap();
    let mut r = Rig {
        dev,
        rx,
        tx,
        ev,
        irq,
        uds,
        rx_bufs: Default::default(),
        rx_payload,
        _dir: dir,
    };
    r.post_rx(rx_count);
    r
}

fn hdr(op: u16, src_port: u32, dst_port: u32) -> VsockHeader {
    VsockHeader {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: 0,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 256 * 1024,
        fwd_cnt: 0,
    }
}

impl Rig {
    /// Gives the device `n` rx buffers shaped like Linux's (header, payload).
    fn post_rx(&mut self, n: usize) {
        for _ in 0..n {
            let (head, addrs) = self.rx.add(&[D::W(HDR_LEN as u32), D::W(self.rx_payload)]);
            self.rx_bufs.insert(head, (addrs[0], addrs[1]));
        }
        self.rx.kick.write(1).unwrap();
    }

    /// Sends one packet from the guest and waits for the device to take it.
    fn send(&mut self, mut h: VsockHeader, payload: &[u8]) {
        h.len = payload.len() as u32;
        let descs = if payload.is_empty() {
            vec![D::R(h.to_bytes().to_vec())]
        } else {
            vec![D::R(h.to_bytes().to_vec()), D::R(payload.to_vec())]
        };
        self.send_raw(&descs);
    }

    fn send_raw(&mut self, descs: &[D]) {
        let (head, _) = self.tx.add_kick(descs);
        let u = self.tx.wait_used();
        assert_eq!((u.head, u.len), (head, 0));
    }

    /// The next packet for the guest (re-posting its buffer).
    fn recv(&mut self) -> (VsockHeader, Vec<u8>) {
        let u = self.rx.wait_used();
        self.read_used(u)
    }

    fn read_used(&mut self, u: Used) -> (VsockHeader, Vec<u8>) {
        let (ha, pa) = self.rx_bufs.remove(&u.head).expect("unknown rx head");
        assert!(u.len as usize >= HDR_LEN, "short rx packet {u:?}");
        let raw: [u8; HDR_LEN] = self.rx.read(ha, HDR_LEN).try_into().unwrap();
        let h = VsockHeader::from_bytes(&raw);
        let payload = self.rx.read(pa, u.len as usize - HDR_LEN);
        assert_eq!(
            h.len as usize,
            payload.len(),
            "len field matches used length"
        );
        assert_eq!(
            (h.src_cid, h.dst_cid, h.type_),
            (HOST_CID, CID, TYPE_STREAM)
        );
        self.post_rx(1);
        (h, payload)
    }

    fn recv_op(&mut self, op: u16) -> (VsockHeader, Vec<u8>) {
        let (h, p) = self.recv();
        assert_eq!(op_name(h.op), op_name(op), "{h:?}");
        (h, p)
    }

    fn host_connect(&self, port: u32) -> UnixStream {
        let s = UnixStream::connect(&self.uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (&s).write_all(format!("CONNECT {port}\n").as_bytes())
            .unwrap();
        s
    }

    fn connections(&self) -> u64 {
        self.dev.metrics_snapshot().connections
    }
}

fn read_n(s: &UnixStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    (&*s).read_exact(&mut v).unwrap();
    v
}

fn read_line(s: &UnixStream) -> String {
    let mut line = Vec::new();
    loop {
        let b = read_n(s, 1)[0];
        if b == b'\n' {
            return String::from_utf8(line).unwrap();
        }
        line.push(b);
    }
}

/// The device closed the socket (an unread line may make that a reset).
fn assert_closed(s: &UnixStream) {
    let mut b = [0u8; 64];
    match (&*s).read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the socket closed, got {other:?}"),
    }
}

fn assert_eof(s: &UnixStream) {
    let mut b = [0u8; 16];
    assert_eq!((&*s).read(&mut b).unwrap(), 0, "expected end of stream");
}

/// Host connects, guest accepts: returns the host stream and the host port.
fn established(r: &mut Rig, guest_port: u32) -> (UnixStream, u32) {
    let host = r.host_connect(guest_port);
    let (req, _) = r.recv_op(OP_REQUEST);
    assert_eq!(req.dst_port, guest_port);
    r.send(hdr(OP_RESPONSE, guest_port, req.src_port), &[]);
    assert_eq!(read_line(&host), format!("OK {}", req.src_port));
    (host, req.src_port)
}

#[test]
fn host_initiated_connection_carries_data_both_ways_and_closes() {
    let mut r = rig();
    let host = r.host_connect(1234);
    let (req, p) = r.recv_op(OP_REQUEST);
    assert!(p.is_empty());
    assert_eq!(req.dst_port, 1234);
    assert!(req.src_port >= 1 << 30, "host port {}", req.src_port);
    assert_eq!((req.buf_alloc, req.fwd_cnt), (BUF_ALLOC, 0));
    wait_until("rx interrupt", || r.irq.queue_count(RX_QUEUE) > 0);
    let local = req.src_port;

    r.send(hdr(OP_RESPONSE, 1234, local), &[]);
    assert_eq!(read_line(&host), format!("OK {local}"));
    assert_eq!(r.connections(), 1);

    (&host).write_all(b"hello").unwrap();
    let (rw, data) = r.recv_op(OP_RW);
    assert_eq!((rw.src_port, rw.dst_port), (local, 1234));
    assert_eq!(data, b"hello");

    r.send(hdr(OP_RW, 1234, local), b"world");
    assert_eq!(read_n(&host, 5), b"world");

    r.send(hdr(OP_CREDIT_REQUEST, 1234, local), &[]);
    let (cu, _) = r.recv_op(OP_CREDIT_UPDATE);
    assert_eq!((cu.buf_alloc, cu.fwd_cnt), (BUF_ALLOC, 5));

    // The host stops sending: the guest sees SHUTDOWN(SEND) but can still
    // send.
    host.shutdown(std::net::Shutdown::Write).unwrap();
    let (sd, _) = r.recv_op(OP_SHUTDOWN);
    assert_eq!(sd.flags, SHUTDOWN_SEND);
    r.send(hdr(OP_RW, 1234, local), b"bye");
    assert_eq!(read_n(&host, 3), b"bye");

    // The guest closes: the host sees the end, the guest gets its RST.
    let mut sd = hdr(OP_SHUTDOWN, 1234, local);
    sd.flags = SHUTDOWN_BOTH;
    r.send(sd, &[]);
    assert_eof(&host);
    let (rst, _) = r.recv_op(OP_RST);
    assert_eq!((rst.src_port, rst.dst_port), (local, 1234));
    assert_eq!(r.connections(), 0);
    let m = r.dev.metrics_snapshot();
    assert_eq!((m.rx_bytes, m.tx_bytes, m.connections_opened), (5, 8, 1));
}

#[test]
fn data_written_right_after_connect_is_kept_for_the_guest() {
    let mut r = rig();
    let host = UnixStream::connect(&r.uds).unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (&host).write_all(b"CONNECT 77\nearly bird").unwrap();
    let (req, _) = r.recv_op(OP_REQUEST);
    r.rx.assert_idle(30); // no data before the guest accepts
    r.send(hdr(OP_RESPONSE, 77, req.src_port), &[]);
    assert_eq!(read_line(&host), format!("OK {}", req.src_port));
    let mut got = Vec::new();
    while got.len() < 10 {
        got.extend(r.recv_op(OP_RW).1);
    }
    assert_eq!(got, b"early bird");
}

#[test]
fn the_guest_refusing_or_ignoring_a_host_connection_closes_it() {
    let mut r = rig();
    let host = r.host_connect(5);
    let (req, _) = r.recv_op(OP_REQUEST);
    r.send(hdr(OP_RST, 5, req.src_port), &[]);
    assert_eof(&host);
    assert_eq!(r.connections(), 0);

    // No answer at all: the host is closed after the timeout, and the
    // guest told to forget the request.
    let host = r.host_connect(6);
    let (req, _) = r.recv_op(OP_REQUEST);
    std::thread::sleep(CONNECT_TIMEOUT);
    let (rst, _) = r.recv_op(OP_RST);
    assert_eq!((rst.src_port, rst.dst_port), (req.src_port, 6));
    assert_eof(&host);
    assert_eq!(r.connections(), 0);
}

#[test]
fn bad_handshakes_are_closed_without_bothering_the_guest() {
    let mut r = rig();
    for line in [
        &b"HELLO 5\n"[..],
        b"CONNECT\n",
        b"CONNECT x\n",
        b"CONNECT 99999999999\n",
        b"CONNECT 1 2 3 4 5 6 7 8 9 10 11 12 13 14\n",
    ] {
        let s = UnixStream::connect(&r.uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (&s).write_all(line).unwrap();
        assert_closed(&s);
    }
    // EOF before a line, and a host that goes away: nothing happens.
    let s = UnixStream::connect(&r.uds).unwrap();
    (&s).write_all(b"CONN").unwrap();
    drop(s);
    r.rx.assert_idle(50);
    // Still serving.
    let _host = r.host_connect(1);
    r.recv_op(OP_REQUEST);
}

#[test]
fn guest_initiated_connection_reaches_uds_port_listener() {
    let mut r = rig();
    let listener = UnixListener::bind(format!("{}_52", r.uds.display())).unwrap();
    r.send(hdr(OP_REQUEST, 7000, 52), &[]);
    let (resp, _) = r.recv_op(OP_RESPONSE);
    assert_eq!((resp.src_port, resp.dst_port), (52, 7000));
    let (host, _) = listener.accept().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

    r.send(hdr(OP_RW, 7000, 52), b"ping");
    assert_eq!(read_n(&host, 4), b"ping");
    (&host).write_all(b"pong").unwrap();
    let (rw, data) = r.recv_op(OP_RW);
    assert_eq!(
        (rw.src_port, rw.dst_port, data.as_slice()),
        (52, 7000, &b"pong"[..])
    );

    // The host program exits: SHUTDOWN both ways, the guest answers RST.
    drop(host);
    let (sd, _) = r.recv_op(OP_SHUTDOWN);
    assert_eq!(sd.flags, SHUTDOWN_BOTH);
    r.send(hdr(OP_RST, 7000, 52), &[]);
    wait_until("connection gone", || r.connections() == 0);
}

#[test]
fn guest_connect_with_nothing_listening_is_reset() {
    let mut r = rig();
    r.send(hdr(OP_REQUEST, 7001, 53), &[]);
    let (rst, _) = r.recv_op(OP_RST);
    assert_eq!((rst.src_port, rst.dst_port), (53, 7001));
    // A stale socket file (nobody accepting) too.
    let l = UnixListener::bind(format!("{}_54", r.uds.display())).unwrap();
    drop(l);
    r.send(hdr(OP_REQUEST, 7002, 54), &[]);
    r.recv_op(OP_RST);
    assert_eq!(r.connections(), 0);
}

#[test]
fn host_to_guest_data_respects_the_guest_credit() {
    let mut r = rig();
    let listener = UnixListener::bind(format!("{}_60", r.uds.display())).unwrap();
    let mut req = hdr(OP_REQUEST, 8000, 60);
    req.buf_alloc = 10;
    r.send(req, &[]);
    r.recv_op(OP_RESPONSE);
    let (host, _) = listener.accept().unwrap();
    (&host).write_all(&[7u8; 25]).unwrap();
    let (_, d) = r.recv_op(OP_RW);
    assert_eq!(d.len(), 10);
    // Out of credit: the device asks for more and sends nothing else.
    r.recv_op(OP_CREDIT_REQUEST);
    r.rx.assert_idle(50);
    // The guest consumed 10 bytes.
    let mut cu = hdr(OP_CREDIT_UPDATE, 8000, 60);
    cu.buf_alloc = 10;
    cu.fwd_cnt = 10;
    r.send(cu, &[]);
    let (_, d) = r.recv_op(OP_RW);
    assert_eq!(d.len(), 10);
    r.recv_op(OP_CREDIT_REQUEST);
    // A bigger buffer: the rest at once.
    cu.buf_alloc = 1000;
    cu.fwd_cnt = 20;
    r.send(cu, &[]);
    let (_, d) = r.recv_op(OP_RW);
    assert_eq!(d.len(), 5);
}

#[test]
fn payloads_larger_than_a_buffer_are_split() {
    let mut r = rig_with(0, 100, 16);
    let (host, local) = established(&mut r, 9);
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    (&host).write_all(&data).unwrap();
    let mut got = Vec::new();
    while got.len() < data.len() {
        let (h, d) = r.recv_op(OP_RW);
        assert!(d.len() <= 100);
        assert_eq!(h.src_port, local);
        got.extend(d);
    }
    assert_eq!(got, data);
}

#[test]
fn a_guest_overrunning_our_credit_is_reset() {
    let mut r = rig();
    let (host, local) = established(&mut r, 10);
    // The host reads nothing; the guest sends far more than buf_alloc.
    let chunk = vec![1u8; MAX_PKT_PAYLOAD];
    let mut reset = false;
    for _ in 0..16 {
        r.send(hdr(OP_RW, 10, local), &chunk);
        if r.connections() == 0 {
            reset = true;
            break;
        }
    }
    assert!(reset, "no reset after 1 MiB against a 256 KiB credit");
    // RST after whatever credit updates came before it.
    loop {
        let (h, _) = r.recv();
        if h.op == OP_RST {
            break;
        }
        assert_eq!(h.op, OP_CREDIT_UPDATE, "{h:?}");
    }
    drop(host);
}

#[test]
fn credit_updates_follow_forwarded_data() {
    let mut r = rig();
    let (host, local) = established(&mut r, 11);
    let chunk = vec![2u8; 32 * 1024];
    r.send(hdr(OP_RW, 11, local), &chunk);
    r.rx.assert_idle(30); // 32 KiB: under the threshold
    r.send(hdr(OP_RW, 11, local), &chunk);
    let (cu, _) = r.recv_op(OP_CREDIT_UPDATE);
    assert_eq!(cu.fwd_cnt, 64 * 1024);
    assert_eq!(read_n(&host, 64 * 1024).len(), 64 * 1024);
}

#[test]
fn malformed_and_misaddressed_packets_never_crash_the_device() {
    let mut r = rig();
    // Wrong source or destination CID: dropped silently.
    let mut h = hdr(OP_REQUEST, 1, 2);
    h.src_cid = 5;
    r.send(h, &[]);
    let mut h = hdr(OP_REQUEST, 1, 2);
    h.dst_cid = 7;
    r.send(h, &[]);
    // Chain shorter than a header; outside guest memory.
    r.send_raw(&[D::R(vec![0; 10])]);
    r.send_raw(&[D::Raw(0x7000_0000, 64, 0)]);
    r.rx.assert_idle(30);
    assert_eq!(r.dev.metrics_snapshot().tx_dropped, 4);

    // Unknown connections: RST for everything but RST.
    r.send(hdr(OP_RST, 1, 2), &[]);
    r.rx.assert_idle(20);
    for op in [OP_RW, OP_RESPONSE, OP_SHUTDOWN, OP_CREDIT_UPDATE, 99] {
        r.send(hdr(op, 100, 200), b"x");
        let (rst, _) = r.recv_op(OP_RST);
        assert_eq!((rst.src_port, rst.dst_port), (200, 100));
    }
    // Not a stream.
    let mut h = hdr(OP_REQUEST, 101, 201);
    h.type_ = 2;
    r.send(h, &[]);
    r.recv_op(OP_RST);
    // len beyond the chain, and absurd.
    let mut h = hdr(OP_RW, 102, 202);
    h.len = 100;
    r.send_raw(&[D::R(h.to_bytes().to_vec()), D::R(vec![0; 10])]);
    r.recv_op(OP_RST);
    h.len = u32::MAX;
    r.send_raw(&[D::R(h.to_bytes().to_vec())]);
    r.recv_op(OP_RST);

    // On a live connection: a second REQUEST resets it.
    let (host, local) = established(&mut r, 12);
    r.send(hdr(OP_REQUEST, 12, local), &[]);
    r.recv_op(OP_RST);
    assert_eof(&host);
    assert_eq!(r.connections(), 0);

    // Still serving after all that.
    let _h = r.host_connect(13);
    r.recv_op(OP_REQUEST);
    assert!(r.dev.metrics_snapshot().resets >= 9);
}

#[test]
fn unusable_rx_chains_are_returned_empty() {
    let mut r = rig_with(0, 4096, 0);
    let (bad, _) = r.rx.add(&[D::R(vec![0; 44]), D::W(4096)]);
    let (small, _) = r.rx.add(&[D::W(20)]);
    let (out, _) = r.rx.add(&[D::Raw(0x7000_0000, 4096, 2)]);
    r.rx.kick.write(1).unwrap();
    let _host = r.host_connect(3);
    for want in [bad, small, out] {
        let u = r.rx.wait_used();
        assert_eq!((u.head, u.len), (want, 0));
    }
    r.post_rx(1);
    r.recv_op(OP_REQUEST);
}

#[test]
fn packets_wait_for_rx_buffers() {
    let mut r = rig_with(0, 4096, 0);
    let _host = r.host_connect(4);
    r.rx.assert_idle(50);
    r.post_rx(1);
    r.recv_op(OP_REQUEST);
}

#[test]
fn too_many_pending_control_packets_pause_tx() {
    let mut r = rig_with(0, 16, 0);
    // Each of these earns an RST; with no rx buffers they pile up.
    let mut sent = 0;
    while sent < MAX_PENDING_CONTROL {
        let batch = 128.min(MAX_PENDING_CONTROL - sent);
        for i in 0..batch {
            r.tx.add(&[D::R(hdr(OP_RW, 1, (sent + i) as u32).to_bytes().to_vec())]);
        }
        r.tx.kick.write(1).unwrap();
        for _ in 0..batch {
            r.tx.wait_used();
        }
        sent += batch;
    }
    // The device stops taking guest packets...
    let (paused, _) =
        r.tx.add_kick(&[D::R(hdr(OP_RW, 1, 99_999).to_bytes().to_vec())]);
    r.tx.assert_idle(100);
    // ...until the guest takes some.
    r.post_rx(64);
    for _ in 0..64 {
        r.recv_op(OP_RST);
    }
    let u = r.tx.wait_used();
    assert_eq!(u.head, paused);
}

#[test]
fn config_features_and_lifecycle() {
    let mut r = rig();
    assert_eq!(r.dev.device_type(), 19);
    assert_eq!(r.dev.device_features(), COMMON_FEATURES);
    assert_eq!(r.dev.queue_max_sizes().len(), 3);
    let mut cid = [0u8; 8];
    r.dev.read_config(0, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), CID);
    let mut hi = [0xffu8; 4];
    r.dev.read_config(4, &mut hi);
    assert_eq!(hi, [0; 4]);
    let mut lo = [0u8; 4];
    r.dev.read_config(0, &mut lo);
    assert_eq!(u32::from_le_bytes(lo), CID as u32);
    for off in [8, 1000, u64::MAX] {
        let mut b = [0xffu8; 8];
        r.dev.read_config(off, &mut b);
        assert_eq!(b, [0; 8]);
    }
    r.dev.write_config(0, &[9; 8]);
    r.dev.read_config(0, &mut cid);
    assert_eq!(u64::from_le_bytes(cid), CID);

    // A connection is closed by reset; the listener stays.
    let (host, _) = established(&mut r, 20);
    r.dev.reset();
    assert_eof(&host);
    let mem = r.rx.memory();
    let err = r
        .dev
        .activate(
            mem.clone(),
            r.irq.clone(),
            vec![r.rx.queue_events(0)],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ActivateError::QueueCount { got: 1, needed: 3 }
    ));
    let err = r
        .dev
        .activate(
            mem.clone(),
            r.irq.clone(),
            vec![
                r.rx.queue_events(0),
                r.rx.queue_events(1),
                r.rx.queue_events(5),
            ],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(err, ActivateError::InvalidQueue(5)), "{err}");

    // A host program connecting while the device is reset is served after
    // the next activation.
    let waiting = UnixStream::connect(&r.uds).unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (&waiting).write_all(b"CONNECT 21\n").unwrap();
    let mut rx = DriverQueue::with_data(&mem, 0x3_0000, 256, 0x1b0_0000, 0x10_0000);
    let tx = DriverQueue::with_data(&mem, 0x4_0000, 256, 0x1c0_0000, 0x10_0000);
    let ev = DriverQueue::with_data(&mem, 0x5_0000, 256, 0x1d0_0000, 0x10_0000);
    r.dev
        .activate(
            mem,
            r.irq.clone(),
            vec![rx.queue_events(0), tx.queue_events(1), ev.queue_events(2)],
            COMMON_FEATURES,
        )
        .unwrap();
    let (_, addrs) = rx.add_kick(&[D::W(HDR_LEN as u32 + 64)]);
    rx.wait_used();
    let h = VsockHeader::from_bytes(&rx.read(addrs[0], HDR_LEN).try_into().unwrap());
    assert_eq!((h.op, h.dst_port), (OP_REQUEST, 21));
}

#[test]
fn event_idx_is_honoured() {
    let mut r = rig_with(
        1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX,
        4096,
        16,
    );
    r.tx.set_used_event(2);
    r.send(hdr(OP_RST, 1, 1), &[]);
    r.send(hdr(OP_RST, 1, 2), &[]);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.irq.queue_count(TX_QUEUE), 0);
    r.send(hdr(OP_RST, 1, 3), &[]);
    wait_until("tx interrupt", || r.irq.queue_count(TX_QUEUE) == 1);
}

#[test]
fn a_paused_device_keeps_its_connections() {
    let mut r = rig();
    let (host, local) = established(&mut r, 1234);
    let positions = r.dev.pause().unwrap();
    assert_eq!(positions.len(), 3);
    // Host data waits in the socket while the device is paused.
    (&host).write_all(b"while paused").unwrap();
    r.rx.assert_idle(50);
    r.dev.resume().unwrap();
    let (rw, data) = r.recv_op(OP_RW);
    assert_eq!(
        (rw.src_port, rw.dst_port, data.as_slice()),
        (local, 1234, &b"while paused"[..])
    );
    r.send(hdr(OP_RW, 1234, local), b"back");
    assert_eq!(read_n(&host, 4), b"back");
}

#[test]
fn a_restored_device_resets_the_transport_and_takes_new_connections() {
    let mut r = rig();
    let (old_host, _) = established(&mut r, 1234);
    let positions = r.dev.pause().unwrap();
    let state = through_json(&r.dev.save_state());
    assert_eq!(state, DeviceState::Vsock(VsockState { cid: CID }));

    // The guest keeps an event buffer posted, as Linux does.
    let (event_head, event_addrs) = r.ev.add(&[D::W(8)]);
    let uds = r._dir.0.join("restored.sock");
    let mut restored =
        Vsock::from_options(&format!("cid={CID},uds={}", uds.display()), "vsock0").unwrap();
    restored
        .restore_state(
            &state,
            Some(Activation {
                memory: r.rx.memory(),
                interrupt: r.irq.clone(),
                queues: vec![
                    at_saved_position(r.rx.queue_events(RX_QUEUE), &positions),
                    at_saved_position(r.tx.queue_events(TX_QUEUE), &positions),
                    at_saved_position(r.ev.queue_events(EVENT_QUEUE), &positions),
                ],
                acked_features: COMMON_FEATURES,
            }),
        )
        .unwrap();
    r.ev.assert_idle(30);
    // The old VMM goes away with its connections.
    r.dev = restored;
    r.uds = uds;
    assert_closed(&old_host);
    r.dev.resume().unwrap();
    let used = r.ev.wait_used();
    assert_eq!((used.head, used.len), (event_head, 4));
    assert_eq!(r.ev.read(event_addrs[0], 4), 0u32.to_le_bytes());
    wait_until("the event interrupt", || r.irq.queue_count(EVENT_QUEUE) > 0);
    // The rx buffers the guest posted before the snapshot are used in
    // order for a new connection.
    let (host, _) = established(&mut r, 4321);
    (&host).write_all(b"after").unwrap();
    let (_, data) = r.recv_op(OP_RW);
    assert_eq!(data, b"after");
}

#[test]
fn a_restore_with_another_cid_is_refused() {
    let r = rig();
    let uds = r._dir.0.join("other.sock");
    let mut other = Vsock::from_options(&format!("cid=7,uds={}", uds.display()), "vsock1").unwrap();
    let err = other.restore_state(&r.dev.save_state(), None).unwrap_err();
    assert!(matches!(err, StateError::Mismatch(_)), "{err}");
    assert_eq!(err.to_string(), "the guest's CID was 3, --vsock gives 7");
}

#[test]
fn options_socket_path_and_errors() {
    let dir = TmpDir::new();
    let uds = dir.0.join("a.sock");
    let c = VsockConfig::parse(&format!("cid=42,uds={},id=v", uds.display())).unwrap();
    assert_eq!(
        c,
        VsockConfig {
            cid: 42,
            uds: uds.clone(),
            id: Some("v".into())
        }
    );
    let err = |s: &str| VsockConfig::parse(s).unwrap_err().to_string();
    assert!(err("uds=/x").contains("missing option 'cid'"));
    assert!(err("cid=3").contains("missing option 'uds'"));
    assert!(err("cid=2,uds=/x").contains("reserved"));
    assert!(err("cid=4294967295,uds=/x").contains("reserved"));
    assert!(err("cid=abc,uds=/x").contains("cid=abc"));
    assert!(err(&format!("cid=3,uds=/{}", "x".repeat(120))).contains("107"));
    assert!(err("cid=3,uds=/x,port=1").contains("unknown option 'port'"));

    let dev = Vsock::new(&c, "vsock0").unwrap();
    assert_eq!(dev.id(), "v");
    assert_eq!((dev.cid(), dev.uds_path()), (42, uds.as_path()));
    // In use.
    let e = Vsock::new(&c, "vsock1").err().unwrap().to_string();
    assert!(e.contains("in use"), "{e}");
    drop(dev);
    assert!(!uds.exists(), "the socket is removed with the device");
    // A stale socket is replaced.
    drop(UnixListener::bind(&uds).unwrap());
    assert!(uds.exists());
    let _dev = Vsock::new(&c, "vsock0").unwrap();
    // Not a socket.
    let file = dir.0.join("f");
    std::fs::write(&file, "").unwrap();
    let e = Vsock::from_options(&format!("cid=3,uds={}", file.display()), "v")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a socket"), "{e}");
}

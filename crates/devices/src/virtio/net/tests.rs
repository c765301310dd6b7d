//! virtio-net tests: the device driven through split queues in test guest
//! memory (`virtio::testing`), with a datagram socket pair standing in for
//! the TAP (every run) and a real TAP plus an AF_PACKET socket on it (when
//! /dev/net/tun can be used).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::device::tap_offloads;
use super::*;
use crate::virtio::state::testing::{at_saved_position, through_json};
use crate::virtio::testing::{
    guest_memory, thread_cpu_ticks, wait_until, DriverQueue, RecordingInterrupt, D,
};
use crate::virtio::{
    ActivateError, Activation, DeviceState, QueuePosition, QueueT, StateError, VirtioDevice,
    COMMON_FEATURES,
};

/// A datagram socket standing in for the TAP: one datagram, one frame.
struct Dgram {
    sock: UnixDatagram,
    offload: Arc<AtomicU32>,
}

impl AsRawFd for Dgram {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl NetBackend for Dgram {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.sock.recv(buf)
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.sock.send(frame)
    }
    fn set_offload(&self, flags: u32) -> io::Result<()> {
        self.offload.store(flags, Ordering::SeqCst);
        Ok(())
    }
    fn name(&self) -> &str {
        "dgram"
    }
}

const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

struct Rig {
    net: Net,
    rx: DriverQueue,
    tx: DriverQueue,
    irq: Arc<RecordingInterrupt>,
    peer: UnixDatagram,
    offload: Arc<AtomicU32>,
}

fn f(bit: u32) -> u64 {
    1 << bit
}

const MRG: u64 = 1 << VIRTIO_NET_F_MRG_RXBUF;

fn rig(acked: u64) -> Rig {
    rig_named("net0", acked)
}

fn rig_named(id: &str, acked: u64) -> Rig {
    let (a, b) = UnixDatagram::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let offload = Arc::new(AtomicU32::new(u32::MAX));
    let backend = Arc::new(Dgram {
        sock: a,
        offload: offload.clone(),
    });
    let net = Net::with_backend(id.into(), backend, MAC, None);
    let mut r = rig_with(net, acked);
    r.peer = b;
    r.offload = offload;
    r
}

fn rig_with(mut net: Net, acked: u64) -> Rig {
    let mem = guest_memory();
    let rx = DriverQueue::with_data(&mem, 0x1000, 256, 0x10_0000, 0x80_0000);
    let tx = DriverQueue::with_data(&mem, 0x1_0000, 256, 0x90_0000, 0x80_0000);
    let irq = RecordingInterrupt::new();
    net.activate(
        mem,
        irq.clone(),
        vec![rx.queue_events(0), tx.queue_events(1)],
        COMMON_FEATURES | acked,
    )
    .unwrap();
    let (peer, _) = UnixDatagram::pair().unwrap();
    Rig {
        net,
        rx,
        tx,
        irq,
        peer,
        offload: Arc::new(AtomicU32::new(0)),
    }
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect();
    if len >= 14 {
        v[..6].copy_from_slice(&MAC);
        v[12] = 0x88;
        v[13] = 0xb5;
    }
    v
}

fn hdr() -> Vec<u8> {
    vec![0u8; NET_HDR_LEN]
}

fn recv_peer(peer: &UnixDatagram) -> Vec<u8> {
    let mut buf = vec![0u8; 70000];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match peer.recv(&mut buf) {
            Ok(n) => return buf[..n].to_vec(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no frame reached the back end");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn assert_peer_idle(peer: &UnixDatagram) {
    std::thread::sleep(Duration::from_millis(30));
    let mut buf = vec![0u8; 70000];
    match peer.recv(&mut buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => panic!("unexpected frame at the back end: {other:?}"),
    }
}

#[test]
fn tx_frames_reach_the_backend_header_and_all() {
    let mut r = rig(MRG);
    let mut h = hdr();
    h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8; // passes through untouched
    let fr = frame(60, 1);
    let (head, _) = r.tx.add_kick(&[
        D::R(h.clone()),
        D::R(fr[..20].to_vec()),
        D::R(fr[20..].to_vec()),
    ]);
    let got = recv_peer(&r.peer);
    assert_eq!(got, [h, fr].concat());
    let used = r.tx.wait_used();
    assert_eq!((used.head, used.len), (head, 0));
    wait_until("tx interrupt", || r.irq.queue_count(TX_QUEUE) > 0);
    let m = r.net.metrics_snapshot();
    assert_eq!((m.tx_frames, m.tx_bytes, m.tx_dropped), (1, 60, 0));
}

#[test]
fn rx_frames_fill_mergeable_buffers() {
    let mut r = rig(MRG);
    let bufs: Vec<_> = (0..3).map(|_| r.rx.add(&[D::W(64)])).collect();
    r.rx.kick.write(1).unwrap();
    let fr = frame(140, 2);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let mut got = Vec::new();
    for (i, want) in [64u32, 64, 24].iter().enumerate() {
        let u = r.rx.wait_used();
        assert_eq!((u.head, u.len), (bufs[i].0, *want));
        got.extend(r.rx.read(bufs[i].1[0], u.len as usize));
    }
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
    assert_eq!(&got[NET_HDR_LEN..], &fr[..]);
    wait_until("rx interrupt", || r.irq.queue_count(RX_QUEUE) > 0);

    // A small frame takes one buffer and says so.
    let (head, addrs) = r.rx.add_kick(&[D::W(1526)]);
    let fr = frame(50, 3);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (head, 62));
    let got = r.rx.read(addrs[0], 62);
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1);
    assert_eq!(&got[12..], &fr[..]);
    let m = r.net.metrics_snapshot();
    assert_eq!((m.rx_frames, m.rx_bytes, m.rx_dropped), (2, 190, 0));
}

#[test]
fn rx_waits_for_buffers_and_keeps_order() {
    let mut r = rig_named("nstall", MRG);
    let a = frame(100, 4);
    let b = frame(80, 5);
    r.peer.send(&[hdr(), a.clone()].concat()).unwrap();
    r.peer.send(&[hdr(), b.clone()].concat()).unwrap();
    r.rx.assert_idle(50);
    // Waiting for buffers costs no CPU (no polling of the back end).
    let before = thread_cpu_ticks("nstall-worker");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        thread_cpu_ticks("nstall-worker") - before <= 2,
        "the worker spins"
    );
    // One buffer: the first frame, then the device waits again.
    let (h1, a1) = r.rx.add_kick(&[D::W(2048)]);
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (h1, 112));
    assert_eq!(r.rx.read(a1[0] + 12, 100), a);
    r.rx.assert_idle(30);
    let (h2, a2) = r.rx.add_kick(&[D::W(2048)]);
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (h2, 92));
    assert_eq!(r.rx.read(a2[0] + 12, 80), b);
    assert_eq!(r.net.metrics_snapshot().rx_dropped, 0);
}

#[test]
fn rx_without_mergeable_buffers_needs_one_chain_per_frame() {
    let mut r = rig(0);
    let (head, addrs) = r.rx.add_kick(&[D::W(12), D::W(100)]);
    let fr = frame(50, 6);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (head, 62));
    let h = r.rx.read(addrs[0], 12);
    assert_eq!(u16::from_le_bytes([h[10], h[11]]), 1);
    assert_eq!(r.rx.read(addrs[1], 50), fr);

    // Too big for the chain: dropped, the chain stays with the device.
    let (small, small_addrs) = r.rx.add_kick(&[D::W(40)]);
    r.peer.send(&[hdr(), frame(50, 7)].concat()).unwrap();
    wait_until("a drop", || r.net.metrics_snapshot().rx_dropped == 1);
    r.rx.assert_idle(20);
    let fr = frame(20, 8);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (small, 32));
    assert_eq!(r.rx.read(small_addrs[0] + 12, 20), fr);
}

#[test]
fn malformed_tx_chains_are_dropped_and_counted() {
    let mut r = rig(MRG);
    let bad: Vec<Vec<D>> = vec![
        vec![D::R(hdr()), D::W(64)],            // device-writable part
        vec![D::R(vec![0; 5])],                 // shorter than the header
        vec![D::Raw(0x7000_0000, 100, 0)],      // outside guest memory
        vec![D::R(vec![0; MAX_FRAME_LEN + 1])], // too big
    ];
    for chain in &bad {
        let (head, _) = r.tx.add_kick(chain);
        let u = r.tx.wait_used();
        assert_eq!((u.head, u.len), (head, 0));
    }
    assert_peer_idle(&r.peer);
    assert_eq!(r.net.metrics_snapshot().tx_dropped, 4);
    // A head index beyond the ring, and the device still works after.
    r.tx.publish(999);
    r.tx.kick.write(1).unwrap();
    let fr = frame(60, 9);
    r.tx.add_kick(&[D::R([hdr(), fr.clone()].concat())]);
    assert_eq!(recv_peer(&r.peer), [hdr(), fr].concat());
    // A frame of exactly the largest size passes.
    let big = frame(MAX_FRAME_LEN - NET_HDR_LEN, 10);
    r.tx.add_kick(&[D::R(hdr()), D::R(big.clone())]);
    assert_eq!(recv_peer(&r.peer).len(), MAX_FRAME_LEN);
}

#[test]
fn malformed_rx_chain_is_returned_empty() {
    let mut r = rig(MRG);
    let (bad, _) = r.rx.add(&[D::R(vec![1; 10]), D::W(100)]);
    let (out, _) = r.rx.add(&[D::Raw(0x7000_0000, 4096, 2)]); // writable, outside memory
    let (good, addrs) = r.rx.add(&[D::W(2048)]);
    r.rx.kick.write(1).unwrap();
    let fr = frame(60, 11);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (bad, 0));
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (out, 0));
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (good, 72));
    assert_eq!(r.rx.read(addrs[0] + 12, 60), fr);
}

#[test]
fn a_corrupt_avail_index_stops_rx_without_spinning_or_panicking() {
    let mut r = rig_named("ncorrupt", MRG);
    r.rx.set_avail_idx(1000); // more than the ring holds
    r.rx.kick.write(1).unwrap();
    r.peer.send(&[hdr(), frame(60, 12)].concat()).unwrap();
    r.rx.assert_idle(50);
    let before = thread_cpu_ticks("ncorrupt-worker");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        thread_cpu_ticks("ncorrupt-worker") - before <= 2,
        "the worker spins"
    );
    // tx still works.
    r.tx.add_kick(&[D::R([hdr(), frame(60, 13)].concat())]);
    recv_peer(&r.peer);
}

#[test]
fn event_idx_suppresses_interrupts_until_used_event() {
    let mut r = rig(MRG | f(VIRTIO_RING_F_EVENT_IDX));
    // The driver asks for an interrupt only after the 4th used buffer
    // (used_event = 3).
    r.tx.set_used_event(3);
    for i in 0..3 {
        r.tx.add_kick(&[D::R([hdr(), frame(60, i)].concat())]);
        r.tx.wait_used();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        r.irq.queue_count(TX_QUEUE),
        0,
        "interrupt before used_event"
    );
    r.tx.add_kick(&[D::R([hdr(), frame(60, 3)].concat())]);
    r.tx.wait_used();
    wait_until("tx interrupt at used_event", || {
        r.irq.queue_count(TX_QUEUE) == 1
    });
}

#[test]
fn rx_short_of_merged_buffers_asks_for_the_drivers_next_buffer() {
    // EVENT_IDX: the driver kicks only when its avail index passes the
    // device's avail_event. A frame needing more buffers than are posted
    // must leave avail_event at the driver's index, not behind it, or the
    // driver never kicks again and rx stalls for good.
    let mut r = rig(MRG | f(VIRTIO_RING_F_EVENT_IDX));
    let first: Vec<_> = (0..2).map(|_| r.rx.add(&[D::W(64)])).collect();
    r.rx.kick.write(1).unwrap();
    let fr = frame(140, 20); // 152 bytes with its header: three buffers
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    r.rx.assert_idle(50);
    wait_until("avail_event at the driver's index", || {
        r.rx.avail_event() == 2
    });
    let third = r.rx.add(&[D::W(64)]);
    r.rx.kick.write(1).unwrap();
    let mut got = Vec::new();
    for (head, addrs) in first.iter().chain(std::iter::once(&third)) {
        let u = r.rx.wait_used();
        assert_eq!(u.head, *head);
        got.extend(r.rx.read(addrs[0], u.len as usize));
    }
    assert_eq!(&got[NET_HDR_LEN..], &fr[..]);
}

#[test]
fn config_space_and_features() {
    let r = rig(MRG);
    let feats = r.net.device_features();
    for b in [
        VIRTIO_NET_F_MAC,
        VIRTIO_NET_F_STATUS,
        VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
    ] {
        assert_ne!(feats & f(b), 0, "feature {b}");
    }
    assert_eq!(feats & COMMON_FEATURES, COMMON_FEATURES);
    assert_eq!(feats & f(VIRTIO_NET_F_MTU), 0);
    assert_eq!(feats & f(VIRTIO_NET_F_CTRL_VQ), 0);
    assert_eq!(r.net.device_type(), 1);
    assert_eq!(r.net.queue_max_sizes().len(), 2);

    let mut mac = [0u8; 6];
    r.net.read_config(0, &mut mac);
    assert_eq!(mac, MAC);
    let mut status = [0u8; 2];
    r.net.read_config(6, &mut status);
    assert_eq!(u16::from_le_bytes(status), VIRTIO_NET_S_LINK_UP as u16);
    let mut pairs = [0u8; 2];
    r.net.read_config(8, &mut pairs);
    assert_eq!(u16::from_le_bytes(pairs), 1);
    let mut tail = [0xffu8; 8];
    r.net.read_config(10, &mut tail);
    assert_eq!(tail, [0; 8]);
    for off in [12, 100, u64::MAX, u64::MAX - 3] {
        let mut b = [0xffu8; 4];
        r.net.read_config(off, &mut b);
        assert_eq!(b, [0; 4]);
    }
    let mut r = r;
    r.net.write_config(0, &[1, 2, 3, 4, 5, 6]);
    r.net.write_config(u64::MAX, &[1]);
    r.net.read_config(0, &mut mac);
    assert_eq!(mac, MAC, "config is read-only");

    let (a, _) = UnixDatagram::pair().unwrap();
    let with_mtu = Net::with_backend(
        "n".into(),
        Arc::new(Dgram {
            sock: a,
            offload: Arc::default(),
        }),
        MAC,
        Some(9000),
    );
    assert_ne!(with_mtu.device_features() & f(VIRTIO_NET_F_MTU), 0);
    let mut mtu = [0u8; 2];
    with_mtu.read_config(10, &mut mtu);
    assert_eq!(u16::from_le_bytes(mtu), 9000);
}

#[test]
fn offloads_follow_the_accepted_features() {
    assert_eq!(tap_offloads(0), 0);
    assert_eq!(
        tap_offloads(f(VIRTIO_NET_F_GUEST_TSO4)),
        0,
        "TSO needs CSUM"
    );
    assert_eq!(
        tap_offloads(f(VIRTIO_NET_F_GUEST_CSUM) | f(VIRTIO_NET_F_GUEST_TSO4)),
        libc::TUN_F_CSUM | libc::TUN_F_TSO4
    );
    assert_eq!(
        tap_offloads(
            f(VIRTIO_NET_F_GUEST_CSUM) | f(VIRTIO_NET_F_GUEST_TSO4) | f(VIRTIO_NET_F_GUEST_TSO6)
        ),
        libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6
    );
    let r = rig(MRG | f(VIRTIO_NET_F_GUEST_CSUM) | f(VIRTIO_NET_F_GUEST_TSO6));
    assert_eq!(
        r.offload.load(Ordering::SeqCst),
        libc::TUN_F_CSUM | libc::TUN_F_TSO6
    );
}

#[test]
fn activate_checks_queues_and_reset_allows_a_new_activation() {
    let mut r = rig(MRG);
    r.net.reset();
    // Frames sent while reset are not taken by a stopped device.
    let mem = r.tx.memory();
    let err = r
        .net
        .activate(
            mem.clone(),
            r.irq.clone(),
            vec![r.rx.queue_events(0)],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(
        matches!(err, ActivateError::QueueCount { got: 1, needed: 2 }),
        "{err}"
    );
    let mut bad = r.tx.queue_events(1);
    bad.queue.set_ready(false);
    let err = r
        .net
        .activate(
            mem.clone(),
            r.irq.clone(),
            vec![r.rx.queue_events(0), bad],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(err, ActivateError::InvalidQueue(1)), "{err}");
    let err = r
        .net
        .activate(
            mem.clone(),
            r.irq.clone(),
            vec![r.rx.queue_events(0), r.rx.queue_events(0)],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(err, ActivateError::InvalidQueue(0)), "{err}");

    // A fresh driver: new queues, the device works again.
    let mut rx = DriverQueue::with_data(&mem, 0x2_0000, 256, 0x100_0000, 0x10_0000);
    let mut tx = DriverQueue::with_data(&mem, 0x3_0000, 256, 0x110_0000, 0x10_0000);
    r.net
        .activate(
            mem,
            r.irq.clone(),
            vec![rx.queue_events(0), tx.queue_events(1)],
            COMMON_FEATURES | MRG,
        )
        .unwrap();
    let fr = frame(60, 14);
    tx.add_kick(&[D::R([hdr(), fr.clone()].concat())]);
    assert_eq!(recv_peer(&r.peer), [hdr(), fr.clone()].concat());
    let (head, _) = rx.add_kick(&[D::W(2048)]);
    r.peer.send(&[hdr(), fr].concat()).unwrap();
    assert_eq!(rx.wait_used().head, head);
    r.net.reset();
    r.net.reset(); // twice is fine
}

/// A datagram pair: the device's end (a back end) and the test's end.
fn dgram_backend() -> (Arc<Dgram>, UnixDatagram) {
    let (a, b) = UnixDatagram::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let backend = Arc::new(Dgram {
        sock: a,
        offload: Arc::new(AtomicU32::new(u32::MAX)),
    });
    (backend, b)
}

#[test]
fn a_paused_device_keeps_frames_for_later_and_resumes() {
    let mut r = rig(MRG);
    let at = r.net.pause().unwrap();
    assert_eq!(
        at,
        [
            QueuePosition {
                index: RX_QUEUE,
                ..Default::default()
            },
            QueuePosition {
                index: TX_QUEUE,
                ..Default::default()
            }
        ]
    );
    // Neither direction moves while paused.
    let fr = frame(60, 21);
    let (tx_head, _) = r.tx.add_kick(&[D::R([hdr(), fr.clone()].concat())]);
    let (rx_head, _) = r.rx.add_kick(&[D::W(2048)]);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    assert_peer_idle(&r.peer);
    r.rx.assert_idle(30);
    r.net.resume().unwrap();
    assert_eq!(recv_peer(&r.peer), [hdr(), fr].concat());
    assert_eq!(r.tx.wait_used().head, tx_head);
    // The frame that came while paused is delivered: its edge was not lost.
    assert_eq!(r.rx.wait_used().head, rx_head);
}

#[test]
fn a_restored_device_goes_on_from_the_saved_positions() {
    let mut r = rig(MRG);
    let fr = frame(100, 5);
    r.tx.add_kick(&[D::R([hdr(), fr.clone()].concat())]);
    assert_eq!(recv_peer(&r.peer), [hdr(), fr.clone()].concat());
    r.tx.wait_used();
    r.rx.add_kick(&[D::W(2048)]);
    r.peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    r.rx.wait_used();
    // Two rx buffers posted and not used yet stay the guest's.
    let waiting: Vec<u16> = (0..2).map(|_| r.rx.add(&[D::W(2048)]).0).collect();
    let positions = r.net.pause().unwrap();
    assert_eq!(
        positions,
        [
            QueuePosition {
                index: RX_QUEUE,
                next_avail: 1,
                next_used: 1
            },
            QueuePosition {
                index: TX_QUEUE,
                next_avail: 1,
                next_used: 1
            }
        ]
    );
    let state = through_json(&r.net.save_state());
    drop(r.net);

    // The new VMM's TAP, the same queues in guest memory.
    let (backend, peer) = dgram_backend();
    let mut restored = Net::with_backend("net0".into(), backend, MAC, None);
    let mem = r.rx.memory();
    restored
        .restore_state(
            &state,
            Some(Activation {
                memory: mem,
                interrupt: r.irq.clone(),
                queues: vec![
                    at_saved_position(r.rx.queue_events(RX_QUEUE), &positions),
                    at_saved_position(r.tx.queue_events(TX_QUEUE), &positions),
                ],
                acked_features: COMMON_FEATURES | MRG,
            }),
        )
        .unwrap();
    restored.resume().unwrap();
    // First, the guest's MAC is announced: a broadcast RARP from it.
    let announced = recv_peer(&peer);
    assert_eq!(announced.len(), hdr().len() + 60);
    let eth = &announced[hdr().len()..];
    assert_eq!(&eth[..6], &[0xff; 6]);
    assert_eq!(&eth[6..12], &MAC);
    assert_eq!(&eth[12..14], &[0x80, 0x35]);
    assert_eq!(&eth[20..22], &[0, 3], "RARP reverse request");
    assert_eq!(&eth[22..28], &MAC);
    let fr = frame(80, 6);
    peer.send(&[hdr(), fr.clone()].concat()).unwrap();
    let u = r.rx.wait_used();
    assert_eq!((u.head, u.len), (waiting[0], 92));
    let (head, _) = r.tx.add_kick(&[D::R([hdr(), fr.clone()].concat())]);
    assert_eq!(recv_peer(&peer), [hdr(), fr].concat());
    assert_eq!(r.tx.wait_used().head, head);
    restored.reset();
}

#[test]
fn a_restore_with_another_mac_or_mtu_is_refused() {
    let (backend, _peer) = dgram_backend();
    let saved = Net::with_backend("net0".into(), backend, MAC, Some(1500)).save_state();
    let (backend, _peer) = dgram_backend();
    let mut other_mac =
        Net::with_backend("net0".into(), backend, [0x52, 0x54, 0, 0, 0, 1], Some(1500));
    let err = other_mac
        .restore_state(&saved, None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "the guest's MAC is 52:54:00:12:34:56, --net gives 52:54:00:00:00:01"
    );
    let (backend, _peer) = dgram_backend();
    let mut no_mtu = Net::with_backend("net0".into(), backend, MAC, None);
    let err = no_mtu.restore_state(&saved, None).unwrap_err().to_string();
    assert!(err.contains("another MTU"), "{err}");
    let DeviceState::Net(mut short) = saved.clone() else {
        unreachable!()
    };
    short.config.truncate(3);
    let err = no_mtu
        .restore_state(&DeviceState::Net(short), None)
        .unwrap_err();
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
}

#[test]
fn options_parse_and_errors_are_named() {
    let c = NetConfig::parse("tap=tap0,mac=52:54:00:ab:cd:ef,mtu=1400,id=eth").unwrap();
    assert_eq!(
        c,
        NetConfig {
            tap: "tap0".into(),
            mac: Some([0x52, 0x54, 0, 0xab, 0xcd, 0xef]),
            mtu: Some(1400),
            id: Some("eth".into()),
            iothread_affinity: None,
        }
    );
    let c = NetConfig::parse("tap0,iothread_affinity=[2]").unwrap();
    assert_eq!(c.iothread_affinity.unwrap().cpus(), &[2]);
    assert_eq!(NetConfig::parse("hk0").unwrap().tap, "hk0");
    let err = |s: &str| NetConfig::parse(s).unwrap_err().to_string();
    assert!(err("").contains("missing option 'tap'"), "{}", err(""));
    assert!(err("tap=abcdefghijklmnop").contains("longer than 15"));
    assert!(err("tap=a/b").contains("not allowed"));
    assert!(err("tap=t,mac=52:54:00:12:34").contains("six hex bytes"));
    assert!(err("tap=t,mac=52:54:00:12:34:zz").contains("six hex bytes"));
    assert!(err("tap=t,mac=52:54:00:12:34:56:78").contains("six hex bytes"));
    assert!(err("tap=t,mac=01:00:5e:00:00:01").contains("multicast"));
    assert!(err("tap=t,mtu=20").contains("mtu=20"));
    assert!(err("tap=t,queues=2").contains("unknown option 'queues'"));
    assert_eq!(format_mac(&MAC), "52:54:00:12:34:56");

    let m = derived_mac("tap0");
    assert_eq!(m, derived_mac("tap0"), "stable");
    assert_ne!(m, derived_mac("tap1"));
    assert_eq!(m[0] & 0b11, 0b10, "locally administered unicast");

    let e = Net::from_options("tap=x,mac=bad", "net0").err().unwrap();
    assert!(e.to_string().starts_with("option mac=bad"), "{e}");
    let e = Tap::open("this-name-is-too-long").unwrap_err();
    assert!(e.to_string().contains("longer than 15"), "{e}");
}

// ---- A real TAP, when this host lets us make one. ----

mod real_tap {
    use super::*;
    use std::ffi::CString;

    const ETHERTYPE: u16 = 0x88b5; // IEEE local experimental

    fn open_tap(tag: &str) -> Option<Tap> {
        let name = format!("hk{}{tag}", std::process::id() % 100_000);
        match Tap::open(&name) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("skipping the real-TAP test: {e}");
                None
            }
        }
    }

    fn ifreq(name: &str) -> libc::ifreq {
        // SAFETY: ifreq is plain old data; all-zero is valid.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        ifr
    }

    /// Disables IPv6 (no router solicitations in the way) and sets the
    /// link up.
    fn link_up(name: &str) {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
        // SAFETY: plain socket(2) call.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(s >= 0);
        let mut ifr = ifreq(name);
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write one ifreq, which
        // `ifr` is; `s` is our socket. Reading the flags member of the union
        // after SIOCGIFFLAGS filled it is what the kernel ABI defines.
        unsafe {
            assert_eq!(libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr), 0);
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as i16;
            assert_eq!(libc::ioctl(s, libc::SIOCSIFFLAGS, &mut ifr), 0);
            libc::close(s);
        }
    }

    /// An AF_PACKET socket on interface `name` for our ethertype.
    struct Packet(RawFd);

    impl Packet {
        fn bind(name: &str) -> Packet {
            let proto = ETHERTYPE.to_be();
            // SAFETY: plain socket(2) call.
            let fd = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    i32::from(proto),
                )
            };
            assert!(fd >= 0, "{}", io::Error::last_os_error());
            let cname = CString::new(name).unwrap();
            // SAFETY: `cname` is a valid NUL-terminated string.
            let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
            assert_ne!(index, 0);
            // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = index as i32;
            // SAFETY: `sll` is a sockaddr_ll of the size given, alive for
            // the call.
            let ret = unsafe {
                libc::bind(
                    fd,
                    &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(ret, 0, "{}", io::Error::last_os_error());
            Packet(fd)
        }

        fn send(&self, frame: &[u8]) {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe { libc::send(self.0, frame.as_ptr().cast(), frame.len(), 0) };
            assert_eq!(n, frame.len() as isize, "{}", io::Error::last_os_error());
        }

        fn recv(&self) -> Vec<u8> {
            let mut buf = vec![0u8; 70000];
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                // SAFETY: the buffer is valid for its length.
                let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n >= 0 {
                    return buf[..n as usize].to_vec();
                }
                assert!(Instant::now() < deadline, "no frame on the TAP");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    impl Drop for Packet {
        fn drop(&mut self) {
            // SAFETY: we own the fd.
            unsafe { libc::close(self.0) };
        }
    }

    fn eth(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
        [&dst[..], &src[..], &ETHERTYPE.to_be_bytes()[..], payload].concat()
    }

    #[test]
    fn frames_cross_a_real_tap_both_ways() {
        let Some(tap) = open_tap("a") else { return };
        let name = tap.if_name().to_string();
        link_up(&name);
        let packet = Packet::bind(&name);
        let net = Net::with_backend("net0".into(), Arc::new(tap), MAC, None);
        let mut r = rig_with(net, MRG);

        // Guest -> host.
        let out = eth([0xff; 6], MAC, &[0x42; 64]);
        r.tx.add_kick(&[D::R(hdr()), D::R(out.clone())]);
        assert_eq!(packet.recv(), out);
        assert_eq!(r.net.metrics_snapshot().tx_frames, 1);

        // Host -> guest, across two mergeable buffers.
        let (h1, a1) = r.rx.add(&[D::W(40)]);
        let (h2, a2) = r.rx.add(&[D::W(2048)]);
        r.rx.kick.write(1).unwrap();
        let inbound = eth(MAC, [2, 0, 0, 0, 0, 1], &[0x17; 100]);
        packet.send(&inbound);
        let u1 = r.rx.wait_used();
        let u2 = r.rx.wait_used();
        assert_eq!((u1.head, u1.len), (h1, 40));
        assert_eq!(u2.head, h2);
        let got = [r.rx.read(a1[0], 40), r.rx.read(a2[0], u2.len as usize)].concat();
        assert_eq!(u16::from_le_bytes([got[10], got[11]]), 2);
        assert_eq!(got[0], 0, "no offload flags without GUEST_CSUM");
        assert_eq!(&got[NET_HDR_LEN..], &inbound[..]);
    }

    #[test]
    fn offloads_are_accepted_by_the_tap() {
        let Some(tap) = open_tap("b") else { return };
        tap.set_offload(libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6)
            .unwrap();
        tap.set_offload(0).unwrap();
        let net = Net::with_backend("net0".into(), Arc::new(tap), MAC, None);
        let _r = rig_with(
            net,
            MRG | f(VIRTIO_NET_F_GUEST_CSUM) | f(VIRTIO_NET_F_GUEST_TSO4),
        );
    }
}

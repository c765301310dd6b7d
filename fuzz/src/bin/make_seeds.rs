//! Writes the seed inputs under `seeds/<target>/` (except block_request's,
//! which are hand-made): real RFB sessions, a WebSocket upgrade and
//! frames, API requests, a migration stream, a snapshot file, a virtio
//! driver's initialization and well-formed queues, each
//! produced by the project's own writers where it has one. Run from
//! `fuzz/`: `cargo run --release --bin make_seeds`.

use std::fs;
use std::path::Path;

use vm_memory::{Bytes, GuestAddress};

use vmm::memory::GuestMemoryMmap;
use vmm::migration::protocol::{write_message, Message, PageKind, PAGE_SIZE, PROTOCOL_VERSION};
use vmm::migration::source::StateEnvelope;
use vmm::migration::{Hello, MigrationMode};
use vmm::snapshot::file::write_snapshot;
use vmm::snapshot::HAKONIWA_VERSION;

fn main() {
    rfb_session();
    websocket();
    http_api();
    migration_stream();
    snapshot_file();
    vsock_tx();
    vsock_queues();
    virtio_pci();
    net_queues();
    balloon_queues();
    input_queues();
    block_device();
    device_state();
    device_state_fields();
}

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("seeds").join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

/// A client's messages once the handshake is over: a 16-bit pixel
/// format, encodings (ZRLE, CopyRect, Raw), a full and an incremental
/// update request, a key, the pointer and clipboard text.
fn rfb_messages() -> Vec<u8> {
    let mut m = vec![0, 0, 0, 0];
    // SetPixelFormat: 16 bpp, depth 16, little-endian, true colour, 5-6-5.
    m.extend_from_slice(&[16, 16, 0, 1, 0, 31, 0, 63, 0, 31, 11, 5, 0, 0, 0, 0]);
    m.extend_from_slice(&[2, 0, 0, 3]);
    for encoding in [16i32, 1, 0] {
        m.extend_from_slice(&encoding.to_be_bytes());
    }
    m.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 70, 0, 40]);
    m.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 0x0d]);
    m.extend_from_slice(&[5, 1, 0, 10, 0, 20]);
    m.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 5]);
    m.extend_from_slice(b"hello");
    m.extend_from_slice(&[3, 1, 0, 0, 0, 0, 0, 70, 0, 40]);
    m
}

fn rfb_session() {
    let messages = rfb_messages();
    // (control byte, name, client bytes before ClientInit)
    let sessions: [(u8, &str, &[u8]); 5] = [
        (0, "v38_none", b"RFB 003.008\n\x01"),
        (0x14, "v38_none_split", b"RFB 003.008\n\x01"),
        (0, "v37_none", b"RFB 003.007\n\x01"),
        // With the password, the harness answers the challenge.
        (0x03, "v38_password", b"RFB 003.008\n\x02"),
        (0x2b, "v33_password_split", b"RFB 003.003\n"),
    ];
    for (control, name, handshake) in sessions {
        let mut input = vec![control];
        input.extend_from_slice(handshake);
        input.push(1); // ClientInit, shared
        input.extend_from_slice(&messages);
        put("rfb_session", name, &input);
    }
    // Without the password: a wrong response.
    let mut input = vec![0x01];
    input.extend_from_slice(b"RFB 003.008\n\x02");
    input.extend_from_slice(&[0x55; 16]);
    put("rfb_session", "v38_wrong_password", &input);
}

/// A client-to-server WebSocket frame (masked, as RFC 6455 requires).
fn frame(opcode_and_fin: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut f = vec![opcode_and_fin];
    if payload.len() < 126 {
        f.push(0x80 | payload.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn websocket() {
    let upgrade = "GET / HTTP/1.1\r\nHost: 127.0.0.1:5700\r\nUpgrade: websocket\r\n\
        Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: binary\r\n\
        Origin: https://console.example\r\n\r\n";
    let mut input = upgrade.as_bytes().to_vec();
    input.extend(frame(0x82, b"RFB 003.008\n"));
    // A fragmented binary message, a ping between its pieces.
    input.extend(frame(0x02, b"\x01"));
    input.extend(frame(0x89, b"ping"));
    input.extend(frame(0x80, b"\x01"));
    input.extend(frame(0x82, &rfb_messages()));
    input.extend(frame(0x88, &1000u16.to_be_bytes()));
    put("websocket", "novnc_session", &input);
}

fn http_api() {
    let requests = [
        (
            "ping",
            "GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n\r\n".to_string(),
        ),
        (
            "pipelined",
            "GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\n\r\n\
             PUT /api/v1/vm.pause HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n\
             GET /api/v1/vm.counters?x=1 HTTP/1.0\r\n\r\n"
                .to_string(),
        ),
        (
            "snapshot_body",
            body_request("/api/v1/vm.snapshot", r#"{"path":"/tmp/vm.snap"}"#, false),
        ),
        (
            "migrate_continue",
            body_request(
                "/api/v1/vm.migrate",
                r#"{"to":"tcp:127.0.0.1:7000","mode":"hybrid"}"#,
                true,
            ),
        ),
        (
            "balloon_close",
            body_request("/api/v1/vm.balloon", r#"{"target_mib":64}"#, false)
                + "Connection: close\r\n",
        ),
    ];
    for (name, request) in requests {
        put("http_api", name, request.as_bytes());
    }
}

fn body_request(path: &str, body: &str, expect: bool) -> String {
    let expect = if expect {
        "Expect: 100-continue\r\n"
    } else {
        ""
    };
    format!(
        "PUT {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         {expect}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn migration_stream() {
    let machine = hakoniwa_fuzz::migration_machine();
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        hakoniwa: HAKONIWA_VERSION.to_string(),
        mode: MigrationMode::Precopy,
        machine: machine.clone(),
        resume: false,
    };
    let page = |seed: u8| -> Vec<u8> { (0..PAGE_SIZE).map(|i| (i as u8) ^ seed).collect() };
    let mut stream = Vec::new();
    let mut send = |m: Message| {
        write_message(&mut stream, &m).unwrap();
    };
    send(Message::Hello(serde_json::to_vec(&hello).unwrap()));
    send(Message::Pages {
        kind: PageKind::Precopy,
        first: 0,
        data: [page(1), page(2)].concat(),
    });
    send(Message::Zero {
        kind: PageKind::Precopy,
        first: 2,
        count: 14,
    });
    // The second region, at 1 MiB (page 0x100).
    send(Message::Pages {
        kind: PageKind::Precopy,
        first: 0x100,
        data: page(3),
    });
    let envelope = StateEnvelope {
        stopped_at_unix_ns: 1,
        snapshot: hakoniwa_fuzz::vm_state(&machine),
    };
    let prefix = stream.clone();
    let mut precopy = prefix.clone();
    let send_to = |out: &mut Vec<u8>, m: Message| {
        write_message(out, &m).unwrap();
    };
    send_to(
        &mut precopy,
        Message::State(serde_json::to_vec(&envelope).unwrap()),
    );
    send_to(&mut precopy, Message::Done);
    put("migration_stream", "precopy", &precopy);
    let mut postcopy = prefix;
    send_to(
        &mut postcopy,
        Message::Postcopy {
            discard: vec![(0, 1), (0x100, 1)],
        },
    );
    put("migration_stream", "postcopy_switch", &postcopy);
}

fn snapshot_file() {
    // The smallest memory a snapshot describes: 16 KiB in one region.
    let size = 0x4000u64;
    let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap();
    memory
        .write_slice(b"hakoniwa", GuestAddress(0x1000))
        .unwrap();
    let mut machine = hakoniwa_fuzz::migration_machine();
    machine.memory_bytes = size;
    machine.ram_regions = arch::layout::ram_regions(size);
    let path = std::env::temp_dir().join(format!("hakoniwa-seed-{}.snap", std::process::id()));
    write_snapshot(&path, &hakoniwa_fuzz::vm_state(&machine), &memory).unwrap();
    let file = fs::read(&path).unwrap();
    let _ = fs::remove_file(&path);
    let mut input = vec![hakoniwa_fuzz::REPAIR_CHECKSUMS];
    input.extend_from_slice(&file);
    put("snapshot_file", "16k_repaired", &input);
    input[0] = 0;
    put("snapshot_file", "16k", &input);
}

/// A guest tx chain: header (`op` between guest `src_port` and host
/// `dst_port`), then `payload`, after the chain's u16 length.
fn vsock_chain(op: u16, src_port: u32, dst_port: u32, payload: &[u8]) -> Vec<u8> {
    use devices::virtio::vsock::fuzzing::GUEST_CID;
    use devices::virtio::vsock::packet::{
        VsockHeader, HOST_CID, OP_SHUTDOWN, SHUTDOWN_SEND, TYPE_STREAM,
    };
    let hdr = VsockHeader {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: payload.len() as u32,
        type_: TYPE_STREAM,
        op,
        flags: if op == OP_SHUTDOWN { SHUTDOWN_SEND } else { 0 },
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    };
    let mut chain = hdr.to_bytes().to_vec();
    chain.extend_from_slice(payload);
    let mut out = (chain.len() as u16).to_le_bytes().to_vec();
    out.extend(chain);
    out
}

fn vsock_tx() {
    use devices::virtio::vsock::fuzzing::LISTENING_PORT;
    use devices::virtio::vsock::packet::*;
    let port = LISTENING_PORT;
    // The guest connects to a host service, sends, asks for credit, shuts
    // down its sending side and resets.
    let guest_connects = [
        vsock_chain(OP_REQUEST, 1025, port, b""),
        vsock_chain(OP_RW, 1025, port, b"hello from the guest"),
        vsock_chain(OP_CREDIT_REQUEST, 1025, port, b""),
        vsock_chain(OP_CREDIT_UPDATE, 1025, port, b""),
        vsock_chain(OP_SHUTDOWN, 1025, port, b""),
        vsock_chain(OP_RST, 1025, port, b""),
    ]
    .concat();
    put("vsock_tx", "guest_connects", &guest_connects);
    // The guest accepts the host program's connection to its port 5000
    // (the muxer's first host-side port is 2^30) and answers.
    let host_connects = [
        vsock_chain(OP_RESPONSE, 5000, 1 << 30, b""),
        vsock_chain(OP_RW, 5000, 1 << 30, b"hello from the guest"),
        vsock_chain(OP_SHUTDOWN, 5000, 1 << 30, b""),
    ]
    .concat();
    put("vsock_tx", "host_connects", &host_connects);
}

/// The whole vsock device: a guest that takes the host program's
/// connection and exchanges data over its rx and tx queues, one that
/// connects to a host service, and a restored device resetting the
/// transport.
fn vsock_queues() {
    use devices::virtio::fuzzing::{ring_input, DATA};
    use devices::virtio::vsock::fuzzing::*;
    use devices::virtio::vsock::packet::*;
    const W: u16 = 2;
    let rx: Vec<(u64, u32, u16)> = (0..4)
        .map(|i| (DATA + 0x4000 + i * 0x1000, 0x1000, W))
        .collect();
    let rx: Vec<&[(u64, u32, u16)]> = rx.iter().map(std::slice::from_ref).collect();
    let seed = |control: u8, tx: &[Vec<u8>], events: &[u8], evq: &[&[(u64, u32, u16)]]| {
        // tx packets lie one after the other from DATA, a chain each.
        let packets: Vec<Vec<u8>> = tx.iter().map(|c| c[2..].to_vec()).collect();
        let mut at = DATA;
        let mut tx_chains = Vec::new();
        for p in &packets {
            tx_chains.push([(at, p.len() as u32, 0u16)]);
            at += p.len() as u64;
        }
        let tx_chains: Vec<&[(u64, u32, u16)]> = tx_chains.iter().map(|c| &c[..]).collect();
        let mut input = vec![control];
        input.extend_from_slice(&ring_input(&rx));
        input.extend_from_slice(&ring_input(&tx_chains));
        input.extend_from_slice(&ring_input(evq));
        input.push(events.len() as u8);
        input.extend_from_slice(events);
        input.extend(packets.concat());
        input
    };
    let host_connects = seed(
        EVENT_IDX,
        &[
            vsock_chain(OP_RESPONSE, 5000, 1 << 30, b""),
            vsock_chain(OP_RW, 5000, 1 << 30, b"hello from the guest"),
        ],
        &[
            EVENT_HOST_TURN,
            EVENT_HOST_TURN,
            EVENT_TX_KICK,
            EVENT_HOST_WRITE,
            EVENT_HOST_TURN,
            EVENT_RX_KICK,
        ],
        &[],
    );
    put("vsock_queues", "host_connects", &host_connects);
    let guest_connects = seed(
        0,
        &[
            vsock_chain(OP_REQUEST, 1025, LISTENING_PORT, b""),
            vsock_chain(OP_RW, 1025, LISTENING_PORT, b"hello from the guest"),
            vsock_chain(OP_SHUTDOWN, 1025, LISTENING_PORT, b""),
        ],
        &[EVENT_TX_KICK, EVENT_HOST_TURN, EVENT_RX_KICK],
        &[],
    );
    put("vsock_queues", "guest_connects", &guest_connects);
    let restored = seed(
        RESTORED,
        &[],
        &[EVENT_EVENT_KICK, EVENT_HOST_TURN],
        &[&[(DATA + 0x3000, 8, W)]],
    );
    put("vsock_queues", "restored", &restored);
}

/// A driver setting up an rng and a balloon (with statistics) the way
/// Linux does, then offering them buffers, kicking and snapshotting.
fn virtio_pci() {
    use devices::virtio::pci::fuzzing::{Ops, BALLOON, BALLOON_STATS};
    const WRITE: u16 = 2;
    let rng = Ops::new(0)
        .driver_init(1, 16, 0)
        .offer(0, 0, 0x1000, 64, WRITE)
        .snapshot()
        .offer(0, 1, 0x2_0000, 0x1000, WRITE)
        .read(0x1000, 1)
        .read(0x5000, 8);
    put("virtio_pci", "rng", &rng.0);
    // Inflate by a page of the second region, deflate it, and the stats
    // buffer; then the driver resets the device and starts again.
    let balloon = Ops::new(BALLOON | BALLOON_STATS)
        .driver_init(3, 16, 0)
        .memory(0x1000, &0x21u32.to_le_bytes())
        .offer(0, 0, 0x1000, 4, 0)
        .offer(1, 0, 0x1000, 4, 0)
        .offer(2, 0, 0x1100, 60, 0)
        .write(0x2004, 4, 1)
        .read(0x2000, 8)
        .snapshot()
        .common(0x14, 0)
        .driver_init(3, 16, 0);
    put("virtio_pci", "balloon", &balloon.0);
    // A serving balloon restored into a new function, unchanged, then
    // with its queue positions moved; the new one serves on.
    let restored = Ops::new(BALLOON | BALLOON_STATS)
        .driver_init(3, 16, 0)
        .memory(0x1000, &0x21u32.to_le_bytes())
        .offer(0, 0, 0x1000, 4, 0)
        .restore(&[])
        .offer(1, 0, 0x1000, 4, 0)
        .restore(&[(17, 1, 0x0001_0001)])
        .offer(2, 0, 0x1100, 60, 0)
        .read(0x2000, 8);
    put("virtio_pci", "restored", &restored.0);
}

/// Well-formed rx buffers and tx frames, with and without mergeable rx
/// buffers.
fn net_queues() {
    use devices::virtio::fuzzing::{ring_input, DATA};
    use devices::virtio::net::fuzzing::{EVENT_IDX, MRG_RXBUF};
    const W: u16 = 2;
    let tx = ring_input(&[
        &[(DATA, 12, 0), (DATA + 12, 60, 0)],
        &[(DATA + 0x100, 1514, 0)],
    ]);
    let mut frame: Vec<u8> = vec![0; 12];
    frame.extend_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56, 2, 0, 0, 0, 0, 1, 0x08, 0]);
    frame.resize(98, 0x45);
    for (name, control, rx) in [
        (
            "one_buffer_each",
            EVENT_IDX,
            ring_input(&[&[(0x4000, 0x800, W)], &[(0x4800, 0x800, W)]]),
        ),
        (
            "merged",
            MRG_RXBUF,
            ring_input(&[
                &[(0x4000, 64, W)],
                &[(0x4800, 64, W)],
                &[(0x2_0000, 0x1000, W)],
            ]),
        ),
    ] {
        let mut input = vec![control | (2 << 2)];
        input.extend_from_slice(&rx);
        input.extend_from_slice(&tx);
        for _ in 0..2 {
            input.extend_from_slice(&(frame.len() as u16).to_le_bytes());
            input.extend_from_slice(&frame);
        }
        input.extend((0..0x200).map(|i| i as u8));
        put("net_queues", name, &input);
    }
}

/// Linux's balloon driver at work: inflating by frames in both regions,
/// deflating, and statistics the host asks for again.
fn balloon_queues() {
    use devices::virtio::balloon::fuzzing::{EVENT_IDX, STATS_VQ};
    use devices::virtio::fuzzing::{ring_input, DATA};
    let mut input = vec![STATS_VQ | EVENT_IDX];
    input.extend_from_slice(&ring_input(&[&[(DATA, 16, 0)], &[(DATA + 0x10, 8, 0)]]));
    input.extend_from_slice(&ring_input(&[&[(DATA, 8, 0)]]));
    input.extend_from_slice(&ring_input(&[
        &[(DATA + 0x20, 40, 0)],
        &[(DATA + 0x20, 40, 0)],
    ]));
    // Events: stats, inflate, deflate, the host asks for stats, stats.
    input.extend_from_slice(&[5, 2, 0, 1, 3, 2]);
    for pfn in [0x8u32, 0x9, 0x20, 0x21, 0x22, 0x10] {
        input.extend_from_slice(&pfn.to_le_bytes());
    }
    input.resize(input.len() + 8, 0);
    for (tag, value) in [(0u16, 7u64), (1, 3), (4, 0x100_0000), (5, 0x400_0000)] {
        input.extend_from_slice(&tag.to_le_bytes());
        input.extend_from_slice(&value.to_le_bytes());
    }
    put("balloon_queues", "inflate_deflate_stats", &input);
}

/// A keyboard's driver: event buffers posted, keys typed, caps lock
/// set, every configuration query Linux makes; and a tablet's pointer.
fn input_queues() {
    use devices::virtio::fuzzing::{ring_input, DATA};
    use devices::virtio::input::fuzzing::*;
    use devices::virtio::input::InputEvent;
    const W: u16 = 2;
    for (name, control, events) in [
        (
            "keyboard",
            0,
            [
                InputEvent::new(1, 30, 1),
                InputEvent::syn(),
                InputEvent::new(1, 30, 0),
            ],
        ),
        (
            "tablet",
            TABLET | EVENT_IDX,
            [
                InputEvent::new(3, 0, 100),
                InputEvent::new(3, 1, 200),
                InputEvent::syn(),
            ],
        ),
    ] {
        let mut input = vec![control];
        let buffers: Vec<[(u64, u32, u16); 1]> = (0..8).map(|i| [(DATA + 8 * i, 8, W)]).collect();
        let buffers: Vec<&[(u64, u32, u16)]> = buffers.iter().map(|b| &b[..]).collect();
        input.extend_from_slice(&ring_input(&buffers));
        input.extend_from_slice(&ring_input(&[&[(DATA + 0x100, 8, 0)]]));
        let mut ops = Vec::new();
        // The queries of Linux's virtinput_probe: name, serial, ids,
        // properties, each event type's bits, the axes.
        for (select, subsel) in [
            (1, 0),
            (2, 0),
            (3, 0),
            (0x10, 0),
            (0x11, 1),
            (0x11, 2),
            (0x11, 3),
            (0x11, 0x11),
            (0x11, 0x14),
            (0x12, 0),
            (0x12, 1),
        ] {
            ops.extend_from_slice(&[OP_CONFIG, 0, 2, select, subsel]);
        }
        ops.extend_from_slice(&[OP_SEND, events.len() as u8]);
        for e in events {
            ops.extend_from_slice(&e.to_bytes());
        }
        ops.extend_from_slice(&[OP_WAKE, OP_EVENTQ, OP_STATUSQ]);
        let count = 11 + 4;
        input.push(count);
        input.extend_from_slice(&ops);
        input.resize(input.len() + 0x100, 0);
        input.extend_from_slice(&InputEvent::new(0x11, 1, 1).to_bytes());
        put("input_queues", name, &input);
    }
}

/// A driver reading, writing and flushing on two queues, kicking as it
/// goes, then the same with the available index run past the ring.
fn block_device() {
    use devices::virtio::block::fuzzing::*;
    use devices::virtio::fuzzing::{ring_input, DATA};
    const W: u16 = 2;
    let requests = ring_input(&[
        &[(DATA, 16, 0), (DATA + 0x200, 512, W), (DATA + 0x100, 1, W)],
        &[
            (DATA + 0x20, 16, 0),
            (DATA + 0x400, 1024, 0),
            (DATA + 0x101, 1, W),
        ],
        &[(DATA + 0x40, 16, 0), (DATA + 0x102, 1, W)],
        &[
            (DATA + 0x60, 16, 0),
            (DATA + 0x800, 20, W),
            (DATA + 0x103, 1, W),
        ],
    ]);
    // IN sector 1, OUT sector 4 (two sectors), FLUSH, GET_ID.
    let mut headers = vec![0u8; 0x80];
    headers[8] = 1;
    headers[0x20] = 1;
    headers[0x28] = 4;
    headers[0x40] = 4;
    headers[0x60] = 8;
    // (name, byte 0, the number of ops, the ops and their operands)
    for (name, control, count, ops) in [
        (
            "two_queues",
            FLUSH | EVENT_IDX | TWO_QUEUES,
            4,
            vec![OP_KICK, OP_KICK | 1, OP_REAP, OP_DRAIN | 1],
        ),
        (
            "index_jump",
            FLUSH,
            4,
            vec![OP_KICK, OP_AVAIL_IDX, 0x40, 0, OP_KICK, OP_REAP],
        ),
    ] {
        let mut input = vec![control];
        input.extend_from_slice(&requests);
        input.extend_from_slice(&requests);
        input.push(count);
        input.extend_from_slice(&ops);
        input.extend_from_slice(&headers);
        put("block_device", name, &input);
    }
    // An image file with cache=none, threads and io_uring: the read goes
    // into a buffer O_DIRECT cannot take (the page cache, under the direct
    // gate), the write is O_DIRECT, on two queues at once.
    let mixed = ring_input(&[
        &[(DATA, 16, 0), (DATA + 0x201, 512, W), (DATA + 0x100, 1, W)],
        &[
            (DATA + 0x20, 16, 0),
            (DATA + 0x400, 1024, 0),
            (DATA + 0x101, 1, W),
        ],
        &[(DATA + 0x40, 16, 0), (DATA + 0x102, 1, W)],
    ]);
    for (name, engine) in [("file_direct", 0), ("file_direct_uring", URING)] {
        let mut input = vec![FILE_DIRECT | FLUSH | TWO_QUEUES | engine];
        input.extend_from_slice(&mixed);
        input.extend_from_slice(&mixed);
        input.push(4);
        input.extend_from_slice(&[OP_KICK, OP_KICK | 1, OP_REAP, OP_REAP | 1]);
        input.extend_from_slice(&headers);
        put("block_device", name, &input);
    }
}

/// The states real devices save (idle and active, with queues where a
/// driver left them), each restored into the device it came from.
fn device_state() {
    use devices::virtio::state::fuzzing::{device, DEVICES};
    for (kind, name) in DEVICES.iter().enumerate() {
        let state = serde_json::to_vec(&device(kind).unwrap().0.save_state()).unwrap();
        for (suffix, prefix) in device_state_prefixes(kind) {
            put(
                "device_state",
                &format!("{name}_{suffix}"),
                &[prefix, state.clone()].concat(),
            );
        }
    }
}

/// The same devices and queues with the fields of their own state kept
/// (no bytes after the prefix), and with the first field replaced by
/// zeros (the bytes past the input's end).
fn device_state_fields() {
    use devices::virtio::state::fuzzing::DEVICES;
    for (kind, name) in DEVICES.iter().enumerate() {
        for (suffix, prefix) in device_state_prefixes(kind) {
            put("device_state_fields", &format!("{name}_{suffix}"), &prefix);
            let zeroed = [prefix, vec![0, 1]].concat();
            put(
                "device_state_fields",
                &format!("{name}_{suffix}_first_zeroed"),
                &zeroed,
            );
        }
    }
}

/// The prefixes of the device-state targets for device `kind`: idle, and
/// active and kicked, with queue q at entry 3 of its ring, two used, and
/// every feature the device offers.
fn device_state_prefixes(kind: usize) -> [(&'static str, Vec<u8>); 2] {
    use devices::virtio::state::fuzzing::{device, ACTIVE, KICK, MAX_QUEUES};
    let (dev, _host) = device(kind).unwrap();
    let queues = dev.queue_max_sizes().len().min(MAX_QUEUES);
    let features = dev.device_features();
    [("idle", 0), ("active", ACTIVE | KICK)].map(|(suffix, flags)| {
        let mut prefix = vec![kind as u8, flags, queues as u8];
        for q in 0..MAX_QUEUES as u8 {
            prefix.extend_from_slice(&[q, 3, 0, 2, 0]);
        }
        prefix.extend_from_slice(&features.to_le_bytes());
        (suffix, prefix)
    })
}

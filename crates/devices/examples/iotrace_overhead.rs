//! What the I/O tracer's virtual-disk layer (`ctl iotrace start`) costs a
//! request, measured through the whole device: a virtio-blk disk on an
//! image file with cache=writeback (so every traced read is also probed
//! against the host page cache with mincore), its own queue thread and
//! I/O engine (the default, io_uring), and a driver offering one 16 KiB read at a time at
//! random 4 KiB-aligned offsets of a data set held in the host page cache
//! (the FFSB cell's operation size; the host side of that cell when the
//! host cache serves it). Rounds of REQUESTS reads (default 5000)
//! alternate tracing off and on; each round gives the requests per second and the device's
//! threads' CPU per request (everything but this driver thread, which
//! sleeps on the device's interrupt, an eventfd, as a vCPU's irqfd
//! would be signalled).
//!
//!     cargo run --release -p devices --example iotrace_overhead [ROUNDS [REQUESTS [IMAGE_DIR]]]
//!
//! Prints one JSON object per round, then a summary line; bench/iotrace.py
//! runs it and keeps the figures.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use devices::virtio::block::{Block, BlockConfig, CacheMode, Locking};
use devices::virtio::fuzzing::{guest_memory, ring_input, Input, Ring, RING_SIZE};
use devices::virtio::{VirtioDevice, VirtioInterrupt, COMMON_FEATURES};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// Each read's size: the FFSB profile's 16 KiB operations.
const READ_BYTES: u32 = 16 << 10;
/// The data set the reads land in, and the image's size.
const DATA_SET: u64 = 32 << 20;
/// Where the request's parts lie in guest memory (below 0x1000: the ring).
const HEADER: u64 = 0x1000;
const STATUS: u64 = 0x1010;
const DATA: u64 = 0x2000;

/// The queue's interrupt as an eventfd the driver sleeps on.
struct EventInterrupt(EventFd);

impl VirtioInterrupt for EventInterrupt {
    fn notify_queue(&self, _queue: u16) {
        let _ = self.0.write(1);
    }

    fn notify_config(&self) {}
}

fn main() {
    if let Err(e) = run() {
        eprintln!("iotrace_overhead: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("{n}: not a number of rounds"))?,
        None => 10,
    };
    let requests: u64 = match args.next() {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{n}: not a number of requests"))?,
        None => 5000,
    };
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    let image = dir.join(format!("hk-iotrace-overhead-{}.img", std::process::id()));
    let result = measure(&image, rounds, requests);
    let _ = std::fs::remove_file(&image);
    result
}

fn measure(image: &std::path::Path, rounds: usize, requests: u64) -> Result<(), String> {
    // The data set, written and read once: in the host page cache.
    let mut file = File::create(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..DATA_SET >> 20 {
        file.write_all(&chunk).map_err(|e| e.to_string())?;
    }
    file.sync_all().map_err(|e| e.to_string())?;
    std::fs::read(image).map_err(|e| e.to_string())?;

    let mut config = BlockConfig::new(image);
    config.cache = CacheMode::Writeback;
    config.num_queues = Some(1);
    config.queue_size = RING_SIZE;
    let mut block = Block::open(config, Locking::Now).map_err(|e| e.to_string())?;
    // The engine that serves it (threads where io_uring is refused).
    let engine = block.engine();
    let mem = guest_memory();
    let ring = Ring::nth(0);
    // One chain, head 0, offered again for every read: header, data,
    // status. Nothing is available until the loop says so.
    let write = VRING_DESC_F_WRITE as u16;
    let chain = [
        (HEADER, 16, 0),
        (DATA, READ_BYTES, write),
        (STATUS, 1, write),
    ];
    ring.write_from(&mem, &mut Input(&ring_input(&[&chain])));
    mem.write_obj(0u16, GuestAddress(ring.avail + 2))
        .map_err(|e| e.to_string())?;
    let events = ring
        .queue_events(0, RING_SIZE, false)
        .map_err(|e| e.to_string())?;
    let kick = events.kick.try_clone().map_err(|e| e.to_string())?;
    let irq = EventFd::new(0).map_err(|e| e.to_string())?;
    block
        .activate(
            mem.clone(),
            Arc::new(EventInterrupt(irq.try_clone().map_err(|e| e.to_string())?)),
            vec![events],
            COMMON_FEATURES,
        )
        .map_err(|e| e.to_string())?;
    let tracer = block.tracer();

    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut offered: u16 = 0;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let traced = round % 2 == 1;
        let session = if traced {
            let session = tracer.start(requests as usize).map_err(|e| e.to_string())?;
            if !session.probes_host_cache() {
                return Err(format!(
                    "reads are not probed: {}",
                    session.probe_error().unwrap_or("?")
                ));
            }
            Some(session)
        } else {
            None
        };
        let cpu_before = device_threads_cpu_ns()?;
        let start = Instant::now();
        for _ in 0..requests {
            // xorshift: a 4 KiB-aligned offset with room for the read.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let sector = (rng % ((DATA_SET - u64::from(READ_BYTES)) >> 12)) << 3;
            let mut header = [0u8; 16];
            header[8..16].copy_from_slice(&sector.to_le_bytes());
            mem.write_slice(&header, GuestAddress(HEADER))
                .map_err(|e| e.to_string())?;
            mem.write_obj(
                0u16.to_le(),
                GuestAddress(ring.avail + 4 + 2 * u64::from(offered % RING_SIZE)),
            )
            .map_err(|e| e.to_string())?;
            // EVENT_IDX, as a Linux guest's driver does it: interrupt me
            // once the used ring moves past what I have seen.
            mem.write_obj(
                offered.to_le(),
                GuestAddress(ring.avail + 4 + 2 * u64::from(RING_SIZE)),
            )
            .map_err(|e| e.to_string())?;
            offered = offered.wrapping_add(1);
            std::sync::atomic::fence(Ordering::Release);
            mem.write_obj(offered.to_le(), GuestAddress(ring.avail + 2))
                .map_err(|e| e.to_string())?;
            kick.write(1).map_err(|e| e.to_string())?;
            while ring.used_idx(&mem) != offered {
                irq.read().map_err(|e| e.to_string())?;
            }
            let status: u8 = mem
                .read_obj(GuestAddress(STATUS))
                .map_err(|e| e.to_string())?;
            if status != 0 {
                return Err(format!("a read at sector {sector} failed: status {status}"));
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let cpu_ns = device_threads_cpu_ns()? - cpu_before;
        let records = match session {
            Some(_) => {
                let stopped = tracer.stop().map_err(|e| e.to_string())?;
                let records = stopped.records();
                let probed = records
                    .iter()
                    .filter(|r| r.host_cached_bytes.is_some())
                    .count();
                if records.len() as u64 != requests || probed as u64 != requests {
                    return Err(format!(
                        "{} of {requests} reads recorded, {probed} probed",
                        records.len()
                    ));
                }
                records.len()
            }
            None => 0,
        };
        let per_s = requests as f64 / seconds;
        let cpu_per_request_ns = cpu_ns as f64 / requests as f64;
        println!(
            "{{\"round\": {round}, \"traced\": {traced}, \"requests\": {requests}, \"engine\": \"{engine}\", \"read_bytes\": {READ_BYTES}, \"seconds\": {seconds:.4}, \"requests_per_s\": {per_s:.1}, \"device_cpu_ns_per_request\": {cpu_per_request_ns:.1}, \"records\": {records}}}"
        );
        if traced { &mut on } else { &mut off }.push((per_s, cpu_per_request_ns));
    }
    block.reset();
    let median = |v: &[(f64, f64)], cpu: bool| {
        let mut x: Vec<f64> = v.iter().map(|p| if cpu { p.1 } else { p.0 }).collect();
        x.sort_by(f64::total_cmp);
        x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
    };
    eprintln!(
        "median: off {:.0} reads/s, {:.0} ns device CPU each; on {:.0} reads/s, {:.0} ns",
        median(&off, false),
        median(&off, true),
        median(&on, false),
        median(&on, true)
    );
    Ok(())
}

/// CPU time (user and system) of every thread of this process but the
/// main one (the driver), in ns: the device's queue and I/O threads.
fn device_threads_cpu_ns() -> Result<u64, String> {
    let main = std::process::id().to_string();
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/task").map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        if entry.file_name().to_str() == Some(main.as_str()) {
            continue;
        }
        // The thread may have ended since the directory was read.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

//! What counting a virtio-blk request costs: the five stage stamps and
//! the record into the disk's statistics (counters, the kind's histogram,
//! four stage histograms), in ns per request, on one thread and with two
//! queue threads recording into one disk at once (shared or own queue
//! shares).
//!
//!     cargo run --release -p devices --example block_stats_overhead

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use devices::virtio::block::{now_ns, DiskStats, Outcome, RequestKind, RequestRecord, StageTimes};

const REQUESTS: u64 = 1_000_000;
/// Each figure is the best of this many runs: the machine may be busy.
const RUNS: usize = 7;

fn record(kind: RequestKind, times: StageTimes) -> RequestRecord {
    RequestRecord {
        kind,
        outcome: Outcome::Ok,
        bytes: 4096,
        times,
    }
}

/// What the I/O path does per request: stamp five times, count once.
fn one_request(stats: &DiskStats, queue: u16, i: u64) {
    let mut times = StageTimes::kicked_at(now_ns());
    times.dequeue = now_ns();
    stats.dequeued();
    times.submit = now_ns();
    times.complete = now_ns();
    times.interrupt = now_ns();
    let kind = if i.is_multiple_of(4) {
        RequestKind::Write
    } else {
        RequestKind::Read
    };
    stats.completed(queue, &record(kind, times));
}

/// ns per iteration of `body`, the best of [`RUNS`].
fn best(mut body: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            body();
            started.elapsed().as_nanos() as f64 / REQUESTS as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Wall time per request with `threads` threads recording at once into a
/// disk of `queues` queue shares.
fn concurrent(threads: u16, queues: usize) -> f64 {
    best(|| {
        let stats = Arc::new(DiskStats::new(queues));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    for i in 0..REQUESTS {
                        one_request(&stats, t, i);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(stats.snapshot().ops(), REQUESTS * u64::from(threads));
    })
}

fn main() {
    let clock = best(|| {
        for _ in 0..REQUESTS {
            black_box(now_ns());
        }
    });
    let stats = DiskStats::new(1);
    let mut times = StageTimes::kicked_at(now_ns());
    (times.dequeue, times.submit, times.complete, times.interrupt) = (
        times.kick + 2_000,
        times.kick + 9_000,
        times.kick + 60_000,
        times.kick + 64_000,
    );
    let count = best(|| {
        for i in 0..REQUESTS {
            stats.dequeued();
            let kind = if i.is_multiple_of(4) {
                RequestKind::Write
            } else {
                RequestKind::Read
            };
            stats.completed(0, &record(kind, black_box(times)));
        }
    });
    let whole = best(|| {
        let stats = DiskStats::new(1);
        for i in 0..REQUESTS {
            one_request(&stats, 0, i);
        }
    });
    println!("best of {RUNS} runs of {REQUESTS} requests, ns per request:");
    println!("  one clock read (now_ns)                          {clock:6.1}");
    println!("  counting one request (counters, 5 histograms)    {count:6.1}");
    println!("  a whole request (5 clock reads + counting)       {whole:6.1}");
    println!(
        "  two threads at once, one queue share             {:6.1} (wall time / requests per thread)",
        concurrent(2, 1)
    );
    println!(
        "  two threads at once, a share each                {:6.1} (wall time / requests per thread)",
        concurrent(2, 2)
    );
}

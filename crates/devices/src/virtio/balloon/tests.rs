use std::sync::Arc;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::device::discard_pfns;
use super::*;
use crate::virtio::state::testing::{at_saved_position, through_json};
use crate::virtio::testing::{finishes, wait_until, DriverQueue, RecordingInterrupt, D};
use crate::virtio::{
    ActivateError, Activation, DeviceState, StateError, VirtioDevice, COMMON_FEATURES,
};
use crate::GuestMemoryMmap;

const MIB: u64 = 1 << 20;
const STATS_F: u64 = 1 << VIRTIO_BALLOON_F_STATS_VQ;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (4 * MIB) as usize)]).unwrap()
}

fn config_u32(b: &Balloon, offset: u64) -> u32 {
    let mut data = [0u8; 4];
    b.read_config(offset, &mut data);
    u32::from_le_bytes(data)
}

struct Running {
    balloon: Balloon,
    control: Arc<BalloonControl>,
    interrupt: Arc<RecordingInterrupt>,
    inflate: DriverQueue,
    deflate: DriverQueue,
    stats: DriverQueue,
    kicks: Vec<EventFd>,
}

fn start(mem: &GuestMemoryMmap, options: &str, acked: u64) -> Running {
    let (mut balloon, control) = Balloon::from_options(options).unwrap();
    let inflate = DriverQueue::new(mem, 0, 16);
    let deflate = DriverQueue::new(mem, 0x8000, 16);
    let stats = DriverQueue::new(mem, 0x1_0000, 16);
    let mut queues = Vec::new();
    let mut kicks = Vec::new();
    for (i, d) in [&inflate, &deflate, &stats].into_iter().enumerate() {
        if i == 2 && acked & STATS_F == 0 {
            break;
        }
        let q = d.queue_events(i as u16);
        let k = d.kick.try_clone().unwrap();
        queues.push(q);
        kicks.push(k);
    }
    let interrupt = Arc::new(RecordingInterrupt::default());
    balloon
        .activate(mem.clone(), interrupt.clone(), queues, acked)
        .unwrap();
    Running {
        balloon,
        control,
        interrupt,
        inflate,
        deflate,
        stats,
        kicks,
    }
}

fn pfn_bytes(pfns: &[u32]) -> Vec<u8> {
    pfns.iter().flat_map(|p| p.to_le_bytes()).collect()
}

fn stats_bytes(entries: &[(u16, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, val) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&val.to_le_bytes());
    }
    out
}

#[test]
fn options_parse_and_errors() {
    assert_eq!(BalloonConfig::parse("").unwrap(), BalloonConfig::default());
    assert!(BalloonConfig::default().stats);
    let c = BalloonConfig::parse("size=512,deflate_on_oom=on,stats=off,id=bal").unwrap();
    assert_eq!(
        c,
        BalloonConfig {
            id: Some("bal".into()),
            size_mib: 512,
            deflate_on_oom: true,
            stats: false,
        }
    );
    for (text, needle) in [
        ("size=big", "size=big"),
        ("size=99999999999", "at most"),
        ("colour=red", "unknown option 'colour'"),
        ("deflate_on_oom=maybe", "'maybe' is not on or off"),
        ("stats=on,stats=off", "given twice"),
        ("512", "not key=value"),
    ] {
        let err = BalloonConfig::parse(text).unwrap_err().to_string();
        assert!(err.contains(needle), "{text}: {err}");
        assert!(!err.contains('\n'));
    }
    let err = Balloon::from_options("size=x").err().unwrap();
    assert!(err.contains("size=x"), "{err}");
}

#[test]
fn features_queues_and_identity() {
    let (b, _) = Balloon::from_options("").unwrap();
    assert_eq!(b.device_type(), 5);
    assert_eq!(b.id(), "balloon0");
    assert_eq!(b.queue_max_sizes().len(), 3);
    assert_eq!(b.device_features() & COMMON_FEATURES, COMMON_FEATURES);
    assert_ne!(b.device_features() & STATS_F, 0);
    assert_eq!(
        b.device_features() & (1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM),
        0
    );
    assert_eq!(
        b.device_features() & (1 << VIRTIO_BALLOON_F_MUST_TELL_HOST),
        0
    );

    let (b, _) = Balloon::from_options("stats=off,deflate_on_oom=on,id=bb").unwrap();
    assert_eq!(b.id(), "bb");
    assert_eq!(b.queue_max_sizes().len(), 2);
    assert_eq!(b.device_features() & STATS_F, 0);
    assert_ne!(
        b.device_features() & (1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM),
        0
    );
}

#[test]
fn config_space_num_pages_and_actual() {
    let (mut b, control) = Balloon::from_options("size=64").unwrap();
    assert_eq!(config_u32(&b, 0), 64 * 256);
    assert_eq!(control.target_mib(), 64);
    assert_eq!(config_u32(&b, 4), 0);

    // The driver reports the balloon's size.
    b.write_config(4, &(32u32 * 256).to_le_bytes());
    assert_eq!(control.actual_mib(), 32);
    assert_eq!(control.actual_pages(), 32 * 256);
    assert_eq!(config_u32(&b, 4), 32 * 256);
    // A one-byte write lands in the right byte.
    b.write_config(6, &[0x01]);
    assert_eq!(control.actual_pages(), 0x0001_0000 | (32 * 256));
    b.write_config(5, &[0x30]);
    assert_eq!(control.actual_pages(), 0x0001_3000);
    // num_pages is read-only for the driver.
    b.write_config(0, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    assert_eq!(config_u32(&b, 0), 64 * 256);
    assert_eq!(control.actual_pages(), 0);

    // Odd offsets and lengths, out of range: zeros, no panic.
    let mut data = [0xaau8; 16];
    b.read_config(2, &mut data);
    assert_eq!(&data[..2], &((64u32 * 256) >> 16).to_le_bytes()[..2]);
    assert_eq!(&data[6..], &[0u8; 10]);
    let mut data = [0xaau8; 3];
    b.read_config(8, &mut data);
    assert_eq!(data, [0; 3]);
    b.read_config(u64::MAX, &mut data);
    assert_eq!(data, [0; 3]);
    b.write_config(u64::MAX, &[1, 2, 3]);
    b.write_config(7, &[1, 2, 3, 4]);
    b.read_config(0, &mut []);
}

#[test]
fn target_change_raises_a_config_interrupt_once_active() {
    let mem = memory();
    let (b0, c0) = Balloon::from_options("").unwrap();
    // Not active: stored, nothing to notify, no panic.
    c0.set_target_mib(8).unwrap();
    assert_eq!(config_u32(&b0, 0), 8 * 256);
    assert!(!c0.is_active());

    let mut r = start(&mem, "", COMMON_FEATURES | STATS_F);
    assert!(r.control.is_active());
    assert_eq!(r.interrupt.config_count(), 0);
    r.control.set_target_mib(2).unwrap();
    assert_eq!(r.interrupt.config_count(), 1);
    assert_eq!(config_u32(&r.balloon, 0), 2 * 256);
    assert_eq!(r.control.target_mib(), 2);

    // Larger than guest memory (4 MiB) or than num_pages can hold.
    assert_eq!(
        r.control.set_target_mib(5),
        Err(BalloonError::ExceedsMemory {
            mib: 5,
            memory_mib: 4
        })
    );
    assert_eq!(
        r.control.set_target_mib(u64::MAX),
        Err(BalloonError::TooLarge(u64::MAX))
    );
    assert_eq!(r.interrupt.config_count(), 1);
    assert_eq!(r.control.target_mib(), 2);

    // After a reset the driver is gone: no interrupt, actual forgotten.
    r.balloon.write_config(4, &512u32.to_le_bytes());
    r.balloon.reset();
    assert!(!r.control.is_active());
    assert_eq!(r.control.actual_pages(), 0);
    r.control.set_target_mib(3).unwrap();
    assert_eq!(r.interrupt.config_count(), 1);
    assert_eq!(config_u32(&r.balloon, 0), 3 * 256);
}

#[test]
fn inflate_discards_guest_pages_and_skips_bad_pfns() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES);
    let pattern = [0x5au8; 4096];
    for pfn in 0x1ff..=0x203u64 {
        mem.write_slice(&pattern, GuestAddress(pfn << 12)).unwrap();
    }
    // 0x400 is just past the end of memory; u32::MAX far outside.
    let pfns = pfn_bytes(&[0x200, 0x201, 0x400, u32::MAX, 0x203]);
    mem.write_slice(&pfns, GuestAddress(0x3_0000)).unwrap();
    let head = r.inflate.offer(&[D::r(0x3_0000, pfns.len() as u32)]);
    r.kicks[0].write(1).unwrap();
    assert_eq!(r.inflate.wait_used_n(1), vec![(head as u32, 0)]);
    wait_until("the inflate interrupt", || r.interrupt.queue_count(0) == 1);

    let page = |pfn: u64| {
        let mut buf = [0u8; 4096];
        mem.read_slice(&mut buf, GuestAddress(pfn << 12)).unwrap();
        buf
    };
    assert_eq!(page(0x200), [0u8; 4096]);
    assert_eq!(page(0x201), [0u8; 4096]);
    assert_eq!(page(0x203), [0u8; 4096]);
    // Neighbours keep their contents.
    assert_eq!(page(0x1ff), pattern);
    assert_eq!(page(0x202), pattern);
    let counters = r.control.counters();
    assert_eq!(counters.inflated_pages, 5);
    assert_eq!(counters.invalid_pfns, 2);
    assert_eq!(counters.discard_errors, 0);

    // A discarded page is usable again.
    mem.write_slice(&pattern, GuestAddress(0x200 << 12))
        .unwrap();
    assert_eq!(page(0x200), pattern);
}

#[test]
fn discard_follows_regions_and_holes() {
    // Two adjacent regions, then a hole, then a third region.
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), MIB as usize),
        (GuestAddress(MIB), MIB as usize),
        (GuestAddress(3 * MIB), MIB as usize),
    ])
    .unwrap();
    let fill = [0xc3u8; 4096];
    for pfn in [254u64, 255, 256, 257, 258, 768, 769] {
        mem.write_slice(&fill, GuestAddress(pfn << 12)).unwrap();
    }
    // 255..=257 spans the first two regions; 512..=513 is in the hole.
    let (invalid, errors) = discard_pfns(&mem, &[255, 256, 257, 512, 513, 768]);
    assert_eq!((invalid, errors), (2, 0));
    let first = |pfn: u64| {
        let mut b = [0u8; 1];
        mem.read_slice(&mut b, GuestAddress(pfn << 12)).unwrap();
        b[0]
    };
    assert_eq!(
        [254, 255, 256, 257, 258, 768, 769].map(first),
        [0xc3, 0, 0, 0, 0xc3, 0, 0xc3]
    );
    // A run that walks off the end of guest memory.
    let (invalid, _) = discard_pfns(&mem, &[1022, 1023, 1024, 1025]);
    assert_eq!(invalid, 2);
    assert_eq!(discard_pfns(&mem, &[]), (0, 0));
}

#[test]
fn deflate_returns_buffers_and_counts() {
    let mem = memory();
    let mut r = start(&mem, "stats=off", COMMON_FEATURES);
    let pfns = pfn_bytes(&[0x300, 0x301, 0x302]);
    mem.write_slice(&pfns, GuestAddress(0x3_0000)).unwrap();
    let a = r.deflate.offer(&[D::r(0x3_0000, 12)]);
    let b = r.deflate.offer(&[D::r(0x3_0000, 4)]);
    r.kicks[1].write(1).unwrap();
    assert_eq!(r.deflate.wait_used_n(2), vec![(a as u32, 0), (b as u32, 0)]);
    wait_until("the deflate interrupt", || r.interrupt.queue_count(1) >= 1);
    assert_eq!(r.control.counters().deflated_pages, 4);
    assert_eq!(r.control.counters().inflated_pages, 0);
}

#[test]
fn malformed_inflate_chains_never_panic() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES);
    mem.write_slice(&pfn_bytes(&[0x380, 0x381]), GuestAddress(0x3_0000))
        .unwrap();
    let pattern = [0x77u8; 4096];
    mem.write_slice(&pattern, GuestAddress(0x380 << 12))
        .unwrap();
    mem.write_slice(&pattern, GuestAddress(0x381 << 12))
        .unwrap();
    mem.write_slice(&pattern, GuestAddress(0x382 << 12))
        .unwrap();
    let heads = [
        // Write-only: no PFNs to read.
        r.inflate.offer(&[D::w(0x3_0000, 8)]),
        // Outside guest memory.
        r.inflate.offer(&[D::r(4 * MIB - 4, 8)]),
        // A huge length.
        r.inflate.offer(&[D::r(0x3_0000, u32::MAX)]),
        // A length that is not a multiple of 4: one whole PFN.
        r.inflate.offer(&[D::r(0x3_0000, 6)]),
    ];
    r.inflate.add_bad_head();
    r.inflate.add_looping(0x3_0000, 8, false);
    r.kicks[0].write(1).unwrap();
    let used = r.inflate.wait_used_n(5);
    assert_eq!(&used[..4], &heads.map(|h| (h as u32, 0))[..], "{used:?}");
    let mut b = [0u8; 1];
    mem.read_slice(&mut b, GuestAddress(0x380 << 12)).unwrap();
    assert_eq!(b[0], 0, "the one good PFN was discarded");
    mem.read_slice(&mut b, GuestAddress(0x381 << 12)).unwrap();
    // The looping chain repeats 0x380, 0x381: both gone now; nothing else.
    assert_eq!(b[0], 0);
    let mut other = [0u8; 4096];
    mem.read_slice(&mut other, GuestAddress(0x382 << 12))
        .unwrap();
    assert_eq!(other, pattern);
    assert_eq!(r.control.counters().invalid_pfns, 0);
}

#[test]
fn stats_round_trip() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES | STATS_F);
    assert!(r.control.stats_enabled());
    assert_eq!(r.control.last_stats(), None);

    // The driver primes the queue with its first statistics.
    let first = stats_bytes(&[
        (tags::MEMFREE, 1000 * MIB),
        (tags::MEMTOT, 4000 * MIB),
        (tags::SWAP_IN, 7),
        (99, 5),
    ]);
    mem.write_slice(&first, GuestAddress(0x3_0000)).unwrap();
    let a = r.stats.offer(&[D::r(0x3_0000, first.len() as u32)]);
    r.kicks[2].write(1).unwrap();
    wait_until("the first statistics", || r.control.last_stats().is_some());
    let s = r.control.last_stats().unwrap();
    assert_eq!(s.free_memory(), Some(1000 * MIB));
    assert_eq!(s.total_memory(), Some(4000 * MIB));
    assert_eq!(s.available_memory(), None);
    assert_eq!(s.get(tags::SWAP_IN), Some(7));
    assert_eq!(s.get(99), Some(5));
    let names: Vec<String> = s.entries().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["free_memory", "total_memory", "swap_in", "tag_99"]);
    // The device holds the buffer.
    std::thread::sleep(Duration::from_millis(20));
    assert!(r.stats.used().is_empty());

    // The host asks: the buffer goes back to the guest with an interrupt.
    r.control.request_stats();
    assert_eq!(r.stats.wait_used_n(1), vec![(a as u32, 0)]);
    wait_until("the stats interrupt", || r.interrupt.queue_count(2) == 1);

    // The guest answers with fresh values.
    let second = stats_bytes(&[(tags::MEMFREE, 900 * MIB), (tags::AVAIL, 1200 * MIB)]);
    mem.write_slice(&second, GuestAddress(0x3_1000)).unwrap();
    let b = r.stats.offer(&[D::r(0x3_1000, second.len() as u32)]);
    r.kicks[2].write(1).unwrap();
    wait_until("the second statistics", || {
        r.control.last_stats().and_then(|s| s.free_memory()) == Some(900 * MIB)
    });
    assert_eq!(
        r.control.last_stats().unwrap().available_memory(),
        Some(1200 * MIB)
    );

    // fresh_stats waits for the guest's answer.
    let control = r.control.clone();
    let waiter = std::thread::spawn(move || control.fresh_stats(Duration::from_secs(5)));
    assert_eq!(r.stats.wait_used_n(1), vec![(b as u32, 0)]);
    let third = stats_bytes(&[(tags::MEMFREE, 800 * MIB)]);
    mem.write_slice(&third, GuestAddress(0x3_2000)).unwrap();
    r.stats.offer(&[D::r(0x3_2000, third.len() as u32)]);
    r.kicks[2].write(1).unwrap();
    let fresh = waiter.join().unwrap().expect("fresh statistics");
    assert_eq!(fresh.free_memory(), Some(800 * MIB));

    // A guest that does not answer: no fresh statistics, the old ones stay.
    assert_eq!(r.control.fresh_stats(Duration::from_millis(50)), None);
    assert_eq!(r.control.stats().unwrap().free_memory(), Some(800 * MIB));
}

#[test]
fn stats_without_the_feature_do_nothing() {
    let mem = memory();
    let r = start(&mem, "", COMMON_FEATURES);
    assert!(!r.control.stats_enabled());
    r.control.request_stats();
    assert_eq!(r.control.stats(), None);
    assert_eq!(r.control.fresh_stats(Duration::from_millis(10)), None);
}

#[test]
fn stats_buffers_malformed_or_repeated() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES | STATS_F);
    // Outside memory, then a write-only one: no statistics, but the device
    // keeps only the last buffer and returns the others.
    let a = r.stats.offer(&[D::r(4 * MIB - 4, 20)]);
    let b = r.stats.offer(&[D::w(0x3_0000, 20)]);
    // A partial trailing entry is ignored.
    let bytes = stats_bytes(&[(tags::MEMTOT, 42)]);
    mem.write_slice(&bytes, GuestAddress(0x3_0000)).unwrap();
    r.stats.offer(&[D::r(0x3_0000, 15)]);
    r.kicks[2].write(1).unwrap();
    assert_eq!(r.stats.wait_used_n(2), vec![(a as u32, 0), (b as u32, 0)]);
    wait_until("statistics", || r.control.last_stats().is_some());
    let s = r.control.last_stats().unwrap();
    assert_eq!(s.values, vec![(tags::MEMTOT, 42)]);
}

#[test]
fn activation_checks_queues() {
    let mem = memory();
    let (mut b, _) = Balloon::from_options("").unwrap();
    let d0 = DriverQueue::new(&mem, 0, 16);
    let q0 = d0.queue_events(0);
    let err = b
        .activate(
            mem.clone(),
            Arc::new(RecordingInterrupt::default()),
            vec![q0],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ActivateError::QueueCount { got: 1, needed: 2 }
    ));

    // STATS_VQ accepted but its queue missing.
    let d1 = DriverQueue::new(&mem, 0x8000, 16);
    let q0 = d0.queue_events(0);
    let q1 = d1.queue_events(1);
    let err = b
        .activate(
            mem.clone(),
            Arc::new(RecordingInterrupt::default()),
            vec![q0, q1],
            COMMON_FEATURES | STATS_F,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ActivateError::QueueCount { got: 2, needed: 3 }
    ));

    // A queue index the device does not have.
    let q0 = d0.queue_events(0);
    let q1 = d1.queue_events(7);
    let err = b
        .activate(
            mem,
            Arc::new(RecordingInterrupt::default()),
            vec![q0, q1],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(err, ActivateError::InvalidQueue(7)));
}

#[test]
fn a_broken_available_index_does_not_spin_the_worker() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES | STATS_F);
    r.inflate.set_avail_idx(300);
    r.stats.set_avail_idx(300);
    r.kicks[0].write(1).unwrap();
    r.kicks[2].write(1).unwrap();
    r.control.request_stats();
    std::thread::sleep(Duration::from_millis(50));
    assert!(r.inflate.used().is_empty());
    let mut balloon = r.balloon;
    finishes("the reset", move || balloon.reset());
}

#[test]
fn a_restored_balloon_keeps_its_sizes_and_the_stats_buffer_it_held() {
    let mem = memory();
    let mut r = start(&mem, "", COMMON_FEATURES | STATS_F);
    r.control.set_target_mib(2).unwrap();
    r.balloon.write_config(4, &(256u32).to_le_bytes());
    let entries = stats_bytes(&[(tags::MEMFREE, 3 * MIB)]);
    mem.write_slice(&entries, GuestAddress(0x3_0000)).unwrap();
    let held = r.stats.offer(&[D::r(0x3_0000, entries.len() as u32)]);
    r.kicks[2].write(1).unwrap();
    wait_until("the statistics", || r.control.last_stats().is_some());
    let pfns = pfn_bytes(&[0x200, 0x201]);
    mem.write_slice(&pfns, GuestAddress(0x2_0000)).unwrap();
    r.inflate.offer(&[D::r(0x2_0000, 8)]);
    r.kicks[0].write(1).unwrap();
    r.inflate.wait_used_n(1);

    let positions = r.balloon.pause().unwrap();
    let state = through_json(&r.balloon.save_state());
    let DeviceState::Balloon(saved) = &state else {
        panic!("{state:?}")
    };
    assert_eq!(
        (
            saved.num_pages,
            saved.actual,
            saved.held_stats,
            saved.inflated_pages
        ),
        (512, 256, Some(held), 2)
    );
    drop(r.balloon);

    let (mut restored, control) = Balloon::from_options("size=64").unwrap();
    let queues = [&r.inflate, &r.deflate, &r.stats]
        .iter()
        .enumerate()
        .map(|(i, d)| at_saved_position(d.queue_events(i as u16), &positions))
        .collect();
    restored
        .restore_state(
            &state,
            Some(Activation {
                memory: mem.clone(),
                interrupt: r.interrupt.clone(),
                queues,
                acked_features: COMMON_FEATURES | STATS_F,
            }),
        )
        .unwrap();
    // The target the host set wins over --balloon size=; the guest's
    // report and the counters come back.
    assert_eq!(control.target_mib(), 2);
    assert_eq!(control.actual_pages(), 256);
    assert_eq!(control.counters().inflated_pages, 2);
    assert!(control.is_active() && control.stats_enabled());
    restored.resume().unwrap();
    // Asking for statistics returns the buffer the old device held.
    control.request_stats();
    assert_eq!(r.stats.wait_used_n(1), vec![(u32::from(held), 0)]);
}

#[test]
fn a_balloon_with_other_features_or_a_foreign_stats_buffer_is_refused() {
    let (b, _) = Balloon::from_options("").unwrap();
    let saved = b.save_state();
    let (mut no_stats, _) = Balloon::from_options("stats=off").unwrap();
    let err = no_stats.restore_state(&saved, None).unwrap_err();
    assert!(matches!(err, StateError::Mismatch(_)), "{err}");

    let mem = memory();
    let DeviceState::Balloon(mut bad) = saved else {
        unreachable!()
    };
    bad.held_stats = Some(16);
    let (mut balloon, _) = Balloon::from_options("").unwrap();
    let drivers = [
        DriverQueue::new(&mem, 0, 16),
        DriverQueue::new(&mem, 0x8000, 16),
        DriverQueue::new(&mem, 0x1_0000, 16),
    ];
    let queues = drivers
        .iter()
        .enumerate()
        .map(|(i, d)| d.queue_events(i as u16))
        .collect();
    let err = balloon
        .restore_state(
            &DeviceState::Balloon(bad),
            Some(Activation {
                memory: mem.clone(),
                interrupt: Arc::new(RecordingInterrupt::default()),
                queues,
                acked_features: COMMON_FEATURES | STATS_F,
            }),
        )
        .unwrap_err();
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
    assert!(!balloon.control().is_active());
}

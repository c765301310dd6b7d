use std::sync::Arc;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::codes::*;
use super::*;
use crate::virtio::state::testing::{at_saved_position, through_json};
use crate::virtio::testing::{finishes, wait_until, DriverQueue, RecordingInterrupt, D};
use crate::virtio::{
    ActivateError, Activation, DeviceState, StateError, VirtioDevice, COMMON_FEATURES,
};
use crate::GuestMemoryMmap;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
}

/// Selects (select, subsel) and reads back (size, answer), byte by byte.
fn query(dev: &mut Input, select: u8, subsel: u8) -> (u8, Vec<u8>) {
    dev.write_config(0, &[select, subsel]);
    let mut space = [0u8; CONFIG_SIZE];
    for (i, byte) in space.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        dev.read_config(i as u64, &mut b);
        *byte = b[0];
    }
    assert_eq!(space[0], select);
    assert_eq!(space[1], subsel);
    let size = space[2];
    assert!(usize::from(size) <= 128);
    // Past the answer: zeros.
    assert!(space[8 + usize::from(size)..].iter().all(|b| *b == 0));
    (size, space[8..8 + usize::from(size)].to_vec())
}

fn bit(bitmap: &[u8], n: u16) -> bool {
    bitmap
        .get(usize::from(n / 8))
        .is_some_and(|b| b & (1 << (n % 8)) != 0)
}

struct Running {
    dev: Input,
    control: Arc<InputControl>,
    interrupt: Arc<RecordingInterrupt>,
    eventq: DriverQueue,
    statusq: DriverQueue,
    kicks: Vec<EventFd>,
}

fn start(mem: &GuestMemoryMmap, options: &str) -> Running {
    let (mut dev, control) = Input::from_options(options).unwrap();
    let eventq = DriverQueue::new(mem, 0, 16);
    let statusq = DriverQueue::new(mem, 0x8000, 16);
    let q0 = eventq.queue_events(0);
    let k0 = eventq.kick.try_clone().unwrap();
    let q1 = statusq.queue_events(1);
    let k1 = statusq.kick.try_clone().unwrap();
    let interrupt = Arc::new(RecordingInterrupt::default());
    dev.activate(
        mem.clone(),
        interrupt.clone(),
        vec![q0, q1],
        COMMON_FEATURES,
    )
    .unwrap();
    Running {
        dev,
        control,
        interrupt,
        eventq,
        statusq,
        kicks: vec![k0, k1],
    }
}

fn read_event(mem: &GuestMemoryMmap, addr: u64) -> InputEvent {
    let mut b = [0u8; 8];
    mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
    InputEvent::from_bytes(b)
}

/// Posts `n` 8-byte event buffers at 0x4_0000 + 0x100 * (first + i).
fn post(r: &mut Running, first: u64, n: u64) -> Vec<u16> {
    (first..first + n)
        .map(|i| r.eventq.offer(&[D::w(0x4_0000 + 0x100 * i, 8)]))
        .collect()
}

#[test]
fn options_parse_and_errors() {
    let k = InputConfig::parse("keyboard").unwrap();
    assert_eq!(k, InputConfig::new(InputKind::Keyboard));
    let t = InputConfig::parse("kind=tablet,width=1024,height=768,id=tab").unwrap();
    assert_eq!(
        t,
        InputConfig {
            id: Some("tab".into()),
            kind: InputKind::Tablet,
            width: 1024,
            height: 768,
        }
    );
    assert_eq!(InputConfig::parse("tablet").unwrap().width, 32768);
    for (text, needle) in [
        ("", "missing option 'kind'"),
        ("mouse", "expected keyboard or tablet"),
        ("keyboard,width=100", "only for a tablet"),
        ("tablet,width=0", "expected 1 to 65536"),
        ("tablet,height=70000", "expected 1 to 65536"),
        ("tablet,width=wide", "width=wide"),
        ("tablet,colour=red", "unknown option 'colour'"),
        ("tablet,id=a/b", "id=a/b"),
        ("keyboard,tablet", "not key=value"),
    ] {
        let err = InputConfig::parse(text).unwrap_err().to_string();
        assert!(err.contains(needle), "{text}: {err}");
        assert!(!err.contains('\n'));
    }
    assert!(Input::from_options("joystick").is_err());
}

#[test]
fn identity_and_features() {
    let (k, kc) = Input::from_options("keyboard").unwrap();
    assert_eq!(k.device_type(), 18);
    assert_eq!(k.id(), "keyboard0");
    assert_eq!(k.queue_max_sizes().len(), 2);
    assert_eq!(k.device_features() & COMMON_FEATURES, COMMON_FEATURES);
    assert_eq!(kc.kind(), InputKind::Keyboard);
    let (t, tc) = Input::from_options("tablet,id=pointer,width=800,height=600").unwrap();
    assert_eq!(t.id(), "pointer");
    assert_eq!(tc.kind(), InputKind::Tablet);
    assert_eq!(tc.abs_max(), (799, 599));
}

#[test]
fn keyboard_config_space() {
    let (mut k, _) = Input::from_options("keyboard,id=kbd").unwrap();
    let (size, name) = query(&mut k, CFG_ID_NAME, 0);
    assert_eq!(usize::from(size), name.len());
    assert_eq!(name, b"hakoniwa virtio keyboard");
    assert_eq!(query(&mut k, CFG_ID_SERIAL, 0).1, b"kbd");
    let (size, ids) = query(&mut k, CFG_ID_DEVIDS, 0);
    assert_eq!(size, 8);
    assert_eq!(u16::from_le_bytes([ids[0], ids[1]]), BUS_VIRTUAL);
    assert_eq!(query(&mut k, CFG_PROP_BITS, 0).0, 0);

    let (size, keys) = query(&mut k, CFG_EV_BITS, EV_KEY as u8);
    assert_eq!(size, 32);
    assert!(bit(&keys, KEY_A));
    assert!(bit(&keys, KEY_ESC));
    assert!(bit(&keys, 255));
    assert!(!bit(&keys, 0));
    assert!(!bit(&keys, BTN_LEFT));
    let (_, leds) = query(&mut k, CFG_EV_BITS, EV_LED as u8);
    assert_eq!(leds, [0b111]);
    assert_eq!(query(&mut k, CFG_EV_BITS, EV_REP as u8).0, 1);
    assert_eq!(query(&mut k, CFG_EV_BITS, EV_ABS as u8).0, 0);
    assert_eq!(query(&mut k, CFG_EV_BITS, EV_REL as u8).0, 0);
    assert_eq!(query(&mut k, CFG_ABS_INFO, ABS_X as u8).0, 0);
    assert_eq!(query(&mut k, CFG_UNSET, 0).0, 0);
    assert_eq!(query(&mut k, 0x7f, 3).0, 0);
    // ID_NAME with a non-zero subsel is not a question the device answers.
    assert_eq!(query(&mut k, CFG_ID_NAME, 1).0, 0);
}

#[test]
fn tablet_config_space() {
    let (mut t, _) = Input::from_options("tablet,width=1024,height=768").unwrap();
    assert_eq!(query(&mut t, CFG_ID_NAME, 0).1, b"hakoniwa virtio tablet");
    assert_eq!(query(&mut t, CFG_ID_SERIAL, 0).1, b"tablet0");
    let (_, keys) = query(&mut t, CFG_EV_BITS, EV_KEY as u8);
    for b in [BTN_LEFT, BTN_RIGHT, BTN_MIDDLE] {
        assert!(bit(&keys, b));
    }
    assert!(!bit(&keys, KEY_A));
    let (_, abs) = query(&mut t, CFG_EV_BITS, EV_ABS as u8);
    assert_eq!(abs, [0b11]);
    let (_, rel) = query(&mut t, CFG_EV_BITS, EV_REL as u8);
    assert!(bit(&rel, REL_WHEEL));
    assert_eq!(query(&mut t, CFG_EV_BITS, EV_REP as u8).0, 0);
    assert_eq!(query(&mut t, CFG_EV_BITS, EV_LED as u8).0, 0);

    let absinfo = |v: &[u8]| -> Vec<u32> {
        v.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let (size, x) = query(&mut t, CFG_ABS_INFO, ABS_X as u8);
    assert_eq!(size, 20);
    assert_eq!(absinfo(&x), [0, 1023, 0, 0, 0]);
    assert_eq!(
        absinfo(&query(&mut t, CFG_ABS_INFO, ABS_Y as u8).1),
        [0, 767, 0, 0, 0]
    );
    assert_eq!(query(&mut t, CFG_ABS_INFO, 0x2f).0, 0);

    let (mut d, _) = Input::from_options("tablet").unwrap();
    assert_eq!(
        absinfo(&query(&mut d, CFG_ABS_INFO, ABS_X as u8).1)[1],
        32767
    );
}

#[test]
fn config_accesses_out_of_range_and_read_only() {
    let (mut k, _) = Input::from_options("keyboard").unwrap();
    k.write_config(0, &[CFG_ID_NAME, 0]);
    // `size` and the answer are read-only.
    k.write_config(2, &[0xff; 100]);
    let mut all = [0u8; CONFIG_SIZE + 16];
    k.read_config(0, &mut all);
    assert_eq!(&all[8..8 + 8], b"hakoniwa");
    assert!(all[CONFIG_SIZE..].iter().all(|b| *b == 0));
    let mut b = [0xaau8; 4];
    k.read_config(CONFIG_SIZE as u64, &mut b);
    assert_eq!(b, [0; 4]);
    k.read_config(u64::MAX, &mut b);
    assert_eq!(b, [0; 4]);
    k.write_config(u64::MAX, &[1, 2, 3]);
    k.write_config(u64::MAX - 1, &[1, 2, 3]);
    k.read_config(3, &mut []);
    // Writing the subsel alone.
    k.write_config(0, &[CFG_EV_BITS]);
    k.write_config(1, &[EV_LED as u8]);
    let mut head = [0u8; 9];
    k.read_config(0, &mut head);
    assert_eq!(head, [CFG_EV_BITS, EV_LED as u8, 1, 0, 0, 0, 0, 0, 0b111]);
}

#[test]
fn events_reach_the_event_queue_in_order() {
    let mem = memory();
    let mut r = start(&mem, "keyboard");
    let heads = post(&mut r, 0, 5);
    r.kicks[0].write(1).unwrap();
    r.control.key(KEY_A, true);
    r.control.key(KEY_A, false);
    let used = r.eventq.wait_used_n(4);
    assert_eq!(
        used,
        heads[..4]
            .iter()
            .map(|h| (u32::from(*h), 8))
            .collect::<Vec<_>>()
    );
    let got: Vec<InputEvent> = (0..4)
        .map(|i| read_event(&mem, 0x4_0000 + 0x100 * i))
        .collect();
    assert_eq!(
        got,
        [
            InputEvent::new(EV_KEY, KEY_A, 1),
            InputEvent::syn(),
            InputEvent::new(EV_KEY, KEY_A, 0),
            InputEvent::syn(),
        ]
    );
    wait_until("the event interrupt", || r.interrupt.queue_count(0) >= 1);
    assert_eq!(r.control.delivered(), 4);
    assert_eq!(r.control.dropped(), 0);
    std::thread::sleep(Duration::from_millis(20));
    assert!(r.eventq.used().is_empty(), "the fifth buffer stays posted");
}

#[test]
fn events_wait_for_buffers() {
    let mem = memory();
    let mut r = start(&mem, "tablet,width=1024,height=768");
    r.control.pointer_abs(100, 200);
    r.control.button(BTN_LEFT, true);
    r.control.wheel(-1);
    r.control.pointer_abs(5000, 5000); // clamped
    assert_eq!(r.control.pending(), 3 + 2 + 2 + 3);

    post(&mut r, 0, 2);
    r.kicks[0].write(1).unwrap();
    r.eventq.wait_used_n(2);
    wait_until("two deliveries", || r.control.delivered() == 2);
    assert_eq!(r.control.pending(), 8);

    post(&mut r, 2, 8);
    r.kicks[0].write(1).unwrap();
    r.eventq.wait_used_n(8);
    let got: Vec<InputEvent> = (0..10)
        .map(|i| read_event(&mem, 0x4_0000 + 0x100 * i))
        .collect();
    assert_eq!(
        got,
        [
            InputEvent::new(EV_ABS, ABS_X, 100),
            InputEvent::new(EV_ABS, ABS_Y, 200),
            InputEvent::syn(),
            InputEvent::new(EV_KEY, BTN_LEFT, 1),
            InputEvent::syn(),
            InputEvent::new(EV_REL, REL_WHEEL, -1),
            InputEvent::syn(),
            InputEvent::new(EV_ABS, ABS_X, 1023),
            InputEvent::new(EV_ABS, ABS_Y, 767),
            InputEvent::syn(),
        ]
    );
    assert_eq!(r.control.pending(), 0);
    assert_eq!(r.control.dropped(), 0);
}

#[test]
fn overflow_drops_the_oldest_and_counts() {
    let mem = memory();
    let mut r = start(&mem, "keyboard");
    let events: Vec<InputEvent> = (0..EVENT_QUEUE_CAPACITY + 5)
        .map(|i| InputEvent::new(EV_KEY, KEY_A, i as i32))
        .collect();
    r.control.send_events(&events);
    assert_eq!(r.control.dropped(), 5);
    assert_eq!(r.control.pending(), EVENT_QUEUE_CAPACITY);
    post(&mut r, 0, 3);
    r.kicks[0].write(1).unwrap();
    r.eventq.wait_used_n(3);
    let values: Vec<i32> = (0..3)
        .map(|i| read_event(&mem, 0x4_0000 + 0x100 * i).value)
        .collect();
    assert_eq!(values, [5, 6, 7]);
}

#[test]
fn events_without_a_driver_are_dropped() {
    let (mut dev, control) = Input::from_options("keyboard").unwrap();
    assert!(!control.is_active());
    control.key(KEY_A, true);
    assert_eq!(control.pending(), 0);
    assert_eq!(control.dropped(), 2);

    let mem = memory();
    let eventq = DriverQueue::new(&mem, 0, 16);
    let statusq = DriverQueue::new(&mem, 0x8000, 16);
    let q0 = eventq.queue_events(0);
    let q1 = statusq.queue_events(1);
    dev.activate(
        mem.clone(),
        Arc::new(RecordingInterrupt::default()),
        vec![q0, q1],
        COMMON_FEATURES,
    )
    .unwrap();
    assert!(control.is_active());
    control.key(KEY_A, true);
    assert_eq!(control.pending(), 2);
    dev.reset();
    assert!(!control.is_active());
    assert_eq!(control.pending(), 0);
}

#[test]
fn status_queue_is_consumed_and_leds_recorded() {
    let mem = memory();
    let mut r = start(&mem, "keyboard");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&InputEvent::new(EV_LED, LED_CAPSL, 1).to_bytes());
    bytes.extend_from_slice(&InputEvent::new(EV_LED, LED_NUML, 1).to_bytes());
    mem.write_slice(&bytes, GuestAddress(0x5_0000)).unwrap();
    let a = r.statusq.offer(&[D::r(0x5_0000, 16)]);
    r.kicks[1].write(1).unwrap();
    assert_eq!(r.statusq.wait_used_n(1), vec![(u32::from(a), 0)]);
    wait_until("the LEDs", || r.control.leds() == 0b011);
    wait_until("the status interrupt", || r.interrupt.queue_count(1) == 1);

    mem.write_slice(
        &InputEvent::new(EV_LED, LED_CAPSL, 0).to_bytes(),
        GuestAddress(0x5_1000),
    )
    .unwrap();
    // Malformed ones first: write-only, outside memory, a bad head.
    let bad1 = r.statusq.offer(&[D::w(0x5_0000, 8)]);
    let bad2 = r.statusq.offer(&[D::r(0x10_0000 - 4, 8)]);
    r.statusq.add_bad_head();
    let b = r.statusq.offer(&[D::r(0x5_1000, 8)]);
    r.kicks[1].write(1).unwrap();
    assert_eq!(
        r.statusq.wait_used_n(3),
        vec![
            (u32::from(bad1), 0),
            (u32::from(bad2), 0),
            (u32::from(b), 0)
        ]
    );
    wait_until("the LEDs", || r.control.leds() == 0b001);
}

#[test]
fn unusable_event_buffers_are_returned_and_the_event_kept() {
    let mem = memory();
    let mut r = start(&mem, "keyboard");
    let short = r.eventq.offer(&[D::w(0x4_0000, 4)]);
    let read_only = r.eventq.offer(&[D::r(0x4_0100, 8)]);
    let outside = r.eventq.offer(&[D::w(0x10_0000 - 4, 8)]);
    r.eventq.add_bad_head();
    let huge = r.eventq.offer(&[D::w(0x4_0200, u32::MAX)]);
    let good = r.eventq.offer(&[D::w(0x4_0300, 8)]);
    // Split across two descriptors works too.
    let split = r.eventq.offer(&[D::w(0x4_0400, 3), D::w(0x4_0500, 5)]);
    r.control.key(KEY_ESC, true);
    assert_eq!(
        r.eventq.wait_used_n(6),
        vec![
            (u32::from(short), 0),
            (u32::from(read_only), 0),
            (u32::from(outside), 0),
            (u32::from(huge), 0),
            (u32::from(good), 8),
            (u32::from(split), 8),
        ]
    );
    assert_eq!(
        read_event(&mem, 0x4_0300),
        InputEvent::new(EV_KEY, KEY_ESC, 1)
    );
    let mut b = [0u8; 8];
    mem.read_slice(&mut b[..3], GuestAddress(0x4_0400)).unwrap();
    mem.read_slice(&mut b[3..], GuestAddress(0x4_0500)).unwrap();
    assert_eq!(InputEvent::from_bytes(b), InputEvent::syn());
    assert_eq!(r.control.delivered(), 2);
    let _ = &r.dev;
}

#[test]
fn activation_needs_both_queues() {
    let mem = memory();
    let (mut dev, control) = Input::from_options("tablet").unwrap();
    let eventq = DriverQueue::new(&mem, 0, 16);
    let q0 = eventq.queue_events(0);
    let err = dev
        .activate(
            mem,
            Arc::new(RecordingInterrupt::default()),
            vec![q0],
            COMMON_FEATURES,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ActivateError::QueueCount { got: 1, needed: 2 }
    ));
    assert!(!control.is_active());
}

#[test]
fn event_wire_format() {
    let e = InputEvent::new(EV_REL, REL_WHEEL, -2);
    assert_eq!(e.to_bytes(), [2, 0, 8, 0, 0xfe, 0xff, 0xff, 0xff]);
    assert_eq!(InputEvent::from_bytes(e.to_bytes()), e);
    assert_eq!(InputEvent::pointer_abs(u32::MAX, 1)[0].value, i32::MAX);
    assert_eq!(InputEvent::hwheel(1)[0].code, REL_HWHEEL);
}

#[test]
fn a_broken_available_index_does_not_spin_the_worker() {
    let mem = memory();
    let mut r = start(&mem, "keyboard");
    r.eventq.set_avail_idx(500);
    r.statusq.set_avail_idx(500);
    r.control.key(KEY_A, true);
    r.kicks[1].write(1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(r.eventq.used().is_empty());
    assert_eq!(r.control.pending(), 2);
    let mut dev = r.dev;
    finishes("the reset", move || dev.reset());
}

#[test]
fn a_restored_input_device_delivers_what_was_pending() {
    let mem = memory();
    let mut r = start(&mem, "tablet,width=1024,height=768");
    // The guest set its LEDs and selected a configuration field; two
    // events were delivered, the rest wait for buffers.
    let led = InputEvent::new(EV_LED, LED_CAPSL, 1).to_bytes();
    mem.write_slice(&led, GuestAddress(0x5_0000)).unwrap();
    r.statusq.offer(&[D::r(0x5_0000, 8)]);
    r.kicks[1].write(1).unwrap();
    r.statusq.wait_used_n(1);
    wait_until("the LEDs", || r.control.leds() == 0b010);
    r.dev.write_config(0, &[CFG_ID_NAME, 0]);
    post(&mut r, 0, 2);
    r.kicks[0].write(1).unwrap();
    r.control.pointer_abs(10, 20); // three events
    r.eventq.wait_used_n(2);
    wait_until("two deliveries", || r.control.delivered() == 2);

    let positions = r.dev.pause().unwrap();
    // Sent while paused: kept with the others.
    r.control.button(BTN_LEFT, true);
    let state = through_json(&r.dev.save_state());
    let DeviceState::Input(saved) = &state else {
        panic!("{state:?}")
    };
    assert_eq!(saved.pending.len(), 1 + 2);
    assert_eq!((saved.select, saved.leds), (CFG_ID_NAME, 0b010));
    drop(r.dev);

    let (mut restored, control) = Input::from_options("tablet,width=1024,height=768").unwrap();
    let q0 = r.eventq.queue_events(0);
    let k0 = r.eventq.kick.try_clone().unwrap();
    let q1 = r.statusq.queue_events(1);
    restored
        .restore_state(
            &state,
            Some(Activation {
                memory: mem.clone(),
                interrupt: r.interrupt.clone(),
                queues: vec![
                    at_saved_position(q0, &positions),
                    at_saved_position(q1, &positions),
                ],
                acked_features: COMMON_FEATURES,
            }),
        )
        .unwrap();
    assert_eq!(control.leds(), 0b010);
    assert_eq!(control.pending(), 3);
    // The name, as the driver selected it before the snapshot.
    let mut name = [0u8; 8];
    restored.read_config(8, &mut name);
    assert_eq!(&name, b"hakoniwa");
    for i in 2..5 {
        r.eventq.offer(&[D::w(0x4_0000 + 0x100 * i, 8)]);
    }
    restored.resume().unwrap();
    k0.write(1).unwrap();
    r.eventq.wait_used_n(3);
    let got: Vec<InputEvent> = (2..5)
        .map(|i| read_event(&mem, 0x4_0000 + 0x100 * i))
        .collect();
    assert_eq!(
        got,
        [
            InputEvent::syn(),
            InputEvent::new(EV_KEY, BTN_LEFT, 1),
            InputEvent::syn(),
        ]
    );
}

#[test]
fn an_input_device_of_another_kind_does_not_take_a_saved_state() {
    let (keyboard, _) = Input::from_options("keyboard").unwrap();
    let saved = keyboard.save_state();
    let (mut tablet, _) = Input::from_options("tablet").unwrap();
    let err = tablet.restore_state(&saved, None).unwrap_err();
    assert!(matches!(err, StateError::Mismatch(_)), "{err}");
    let DeviceState::Input(mut flood) = saved else {
        unreachable!()
    };
    flood.pending = vec![(1, 30, 1); EVENT_QUEUE_CAPACITY + 1];
    let (mut keyboard, _) = Input::from_options("keyboard").unwrap();
    let err = keyboard
        .restore_state(&DeviceState::Input(flood), None)
        .unwrap_err();
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
}

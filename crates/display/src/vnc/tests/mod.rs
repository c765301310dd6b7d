//! End-to-end tests of the VNC server against a small RFB client (in
//! `client.rs`), over real sockets on localhost.

mod client;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{VncConfig, VncServer};
use crate::geometry::Rect;
use crate::input::InputSink;
use crate::screen::Screen;
use client::{closed_by_server, handshake, read_n, read_string, read_u32, tcp, Format, Got};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Key(u32, bool),
    Pointer(u16, u16, u8),
}

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl InputSink for Recorder {
    fn key(&self, keysym: u32, down: bool) {
        self.events.lock().unwrap().push(Event::Key(keysym, down));
    }
    fn pointer(&self, x: u16, y: u16, buttons: u8) {
        self.events
            .lock()
            .unwrap()
            .push(Event::Pointer(x, y, buttons));
    }
}

struct Setup {
    server: VncServer,
    screen: Arc<Screen>,
    input: Arc<Recorder>,
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn start_with(w: u16, h: u16, password: Option<&str>, websocket: bool) -> Setup {
    start_front(w, h, password, websocket, super::FrontDoor::default())
}

fn start_front(
    w: u16,
    h: u16,
    password: Option<&str>,
    websocket: bool,
    front_door: super::FrontDoor,
) -> Setup {
    let screen = Arc::new(Screen::new(w, h));
    let input = Arc::new(Recorder::default());
    let config = VncConfig {
        listen: localhost(),
        websocket: websocket.then(localhost),
        password: password.map(str::to_string),
        name: "hakoniwa-test".to_string(),
        front_door,
    };
    let server = VncServer::start(config, screen.clone(), input.clone()).expect("start");
    Setup {
        server,
        screen,
        input,
    }
}

fn start(w: u16, h: u16) -> Setup {
    start_with(w, h, None, false)
}

/// A deterministic pseudo-random sequence (xorshift) for test pictures.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

/// Fills the screen with a mix of flat areas, gradients and noise.
fn paint(screen: &Screen, seed: u32) {
    let w = usize::from(screen.width());
    let mut rng = Rng(seed | 1);
    let mut px = screen.write();
    for (i, p) in px.iter_mut().enumerate() {
        let (x, y) = (i % w, i / w);
        *p = match (x / 64 + y / 64) % 3 {
            0 => 0x203040,
            1 => ((x as u32 * 3) << 16) & 0xff0000 | ((y as u32 * 5) << 8) & 0xff00 | 0x40,
            _ => rng.next() & 0xffffff,
        };
    }
}

fn fill(screen: &Screen, r: Rect, mut f: impl FnMut(usize, usize) -> u32) {
    let w = usize::from(screen.width());
    let mut px = screen.write();
    for y in usize::from(r.y)..r.bottom() as usize {
        for x in usize::from(r.x)..r.right() as usize {
            px[y * w + x] = f(x, y);
        }
    }
}

/// The Screen in the client's default format (32 bpp XRGB).
fn screen_values(screen: &Screen) -> Vec<u32> {
    screen.read().iter().map(|p| p & 0xffffff).collect()
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn handshake_3_8_none() {
    let t = start(64, 48);
    let c = handshake(tcp(t.server.local_addr()), None);
    assert_eq!((c.width, c.height), (64, 48));
    assert_eq!(c.name, "hakoniwa-test");
    // 32 bpp, depth 24, little-endian, true colour, 255/255/255, 16/8/0.
    assert_eq!(
        c.server_format,
        [32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]
    );
    eventually("client count", || t.server.clients() == 1);
    assert_eq!(t.server.stats().clients_accepted, 1);
}

#[test]
fn handshake_3_7_none_has_no_security_result() {
    let t = start(32, 16);
    let mut s = tcp(t.server.local_addr());
    assert_eq!(read_n(&mut s, 12).unwrap(), b"RFB 003.008\n");
    s.write_all(b"RFB 003.007\n").unwrap();
    assert_eq!(read_n(&mut s, 2).unwrap(), [1, 1]);
    s.write_all(&[1]).unwrap();
    // Straight to initialisation: the next bytes are ServerInit.
    let c = client::client_init(s);
    assert_eq!((c.width, c.height), (32, 16));
}

#[test]
fn handshake_3_3_server_chooses() {
    let t = start(32, 16);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.003\n").unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 1, "security type None as a u32");
    let c = client::client_init(s);
    assert_eq!((c.width, c.height), (32, 16));

    // An unknown 3.x minor is treated as 3.3.
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.005\n").unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 1);
    client::client_init(s);
}

#[test]
fn handshake_3_3_with_password() {
    let t = start_with(32, 16, Some("secret"), false);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.003\n").unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 2, "VNC authentication");
    let challenge: [u8; 16] = read_n(&mut s, 16).unwrap().try_into().unwrap();
    s.write_all(&super::auth::response("secret", &challenge))
        .unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 0);
    client::client_init(s);
}

#[test]
fn garbage_version_is_closed() {
    let t = start(32, 16);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(closed_by_server(&mut s));
    eventually("refusal counted", || t.server.stats().clients_refused == 1);
    assert_eq!(t.server.stats().clients_accepted, 0);
}

#[test]
fn vnc_auth_right_password() {
    let t = start_with(32, 16, Some("password"), false);
    let c = handshake(tcp(t.server.local_addr()), Some("password"));
    assert_eq!((c.width, c.height), (32, 16));
}

#[test]
fn vnc_auth_wrong_password_3_8_gives_reason() {
    let t = start_with(32, 16, Some("password"), false);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.008\n").unwrap();
    assert_eq!(read_n(&mut s, 2).unwrap(), [1, 2], "only VNC auth offered");
    s.write_all(&[2]).unwrap();
    let challenge: [u8; 16] = read_n(&mut s, 16).unwrap().try_into().unwrap();
    s.write_all(&super::auth::response("wrong", &challenge))
        .unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 1, "failed");
    assert_eq!(read_string(&mut s).unwrap(), "authentication failed");
    assert!(closed_by_server(&mut s));
    eventually("refusal counted", || t.server.stats().clients_refused == 1);
}

#[test]
fn vnc_auth_wrong_password_3_7_has_no_reason() {
    let t = start_with(32, 16, Some("password"), false);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.007\n").unwrap();
    assert_eq!(read_n(&mut s, 2).unwrap(), [1, 2]);
    s.write_all(&[2]).unwrap();
    read_n(&mut s, 16).unwrap();
    s.write_all(&[0u8; 16]).unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 1);
    assert!(closed_by_server(&mut s), "no reason string, just closed");
}

#[test]
fn none_refused_when_password_set() {
    let t = start_with(32, 16, Some("password"), false);
    let mut s = tcp(t.server.local_addr());
    read_n(&mut s, 12).unwrap();
    s.write_all(b"RFB 003.008\n").unwrap();
    read_n(&mut s, 2).unwrap();
    s.write_all(&[1]).unwrap();
    assert_eq!(read_u32(&mut s).unwrap(), 1);
    assert!(read_string(&mut s).unwrap().contains("not offered"));
    assert!(closed_by_server(&mut s));
}

#[test]
fn raw_update_after_damage() {
    let t = start(100, 70);
    paint(&t.screen, 7);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.set_encodings(&[0]);
    c.request(false, c.full());
    let got = c.read_update();
    assert!(got.iter().all(|g| g.encoding == 0));
    assert_eq!(got.iter().map(|g| g.rect.area()).sum::<u64>(), 7000);
    assert_eq!(c.fb, screen_values(&t.screen));

    // A change: exactly that rectangle comes back.
    let changed = Rect::new(10, 20, 30, 5);
    fill(&t.screen, changed, |x, y| (x * 1000 + y) as u32 & 0xffffff);
    t.server.damage(&[changed]);
    c.request(true, c.full());
    assert_eq!(
        c.read_update(),
        vec![Got {
            rect: changed,
            encoding: 0
        }]
    );
    assert_eq!(c.fb, screen_values(&t.screen));

    // Damage outside the requested area waits for a request covering it.
    let elsewhere = Rect::new(90, 60, 10, 10);
    fill(&t.screen, elsewhere, |_, _| 0xabcdef);
    t.server.damage(&[elsewhere, Rect::new(0, 0, 5, 5)]);
    c.request(true, Rect::new(0, 0, 50, 50));
    assert_eq!(
        c.read_update(),
        vec![Got {
            rect: Rect::new(0, 0, 5, 5),
            encoding: 0
        }]
    );
    c.request(true, c.full());
    assert_eq!(
        c.read_update(),
        vec![Got {
            rect: elsewhere,
            encoding: 0
        }]
    );
    assert_eq!(c.fb, screen_values(&t.screen));

    let st = t.server.stats();
    assert_eq!(st.updates, 4);
    assert!(st.rects_raw >= 3 && st.rects_zrle == 0);
    assert!(st.bytes_sent > 7000 * 4);
}

#[test]
fn zrle_updates_decode_to_the_screen() {
    let (w, h) = (300, 200);
    let t = start(w, h);
    // Tiles (64x64) chosen to exercise each subencoding.
    fill(&t.screen, Rect::new(0, 0, w, h), |_, _| 0x102030); // solid
    fill(&t.screen, Rect::new(64, 0, 64, 64), |x, y| {
        if (x + y) % 2 == 0 {
            0xff0000
        } else {
            0x00ff00
        }
    }); // packed, 2
    fill(&t.screen, Rect::new(128, 0, 64, 64), |x, y| {
        [0x1, 0x20, 0x300, 0x4000, 0x50000][(x / 3 + y) % 5]
    }); // packed, 5
    let mut rng = Rng(99);
    fill(&t.screen, Rect::new(192, 0, 64, 64), |_, _| {
        rng_next(&mut rng)
    }); // raw
    fill(&t.screen, Rect::new(0, 64, 64, 64), |x, y| {
        ((y * 64 + x) / 20) as u32 * 0x010203
    }); // plain RLE (>127 colours in runs)
    fill(&t.screen, Rect::new(64, 64, 64, 64), |x, y| {
        ((y * 64 + x) / 2 % 20) as u32 * 0x000101
    }); // palette RLE (20 colours, short runs)
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.set_encodings(&[16, 0]);
    c.request(false, c.full());
    let got = c.read_update();
    assert!(got.iter().all(|g| g.encoding == 16));
    assert_eq!(c.fb, screen_values(&t.screen));
    let subs = &c.zrle_subencodings;
    assert!(subs.contains(&1), "solid: {subs:?}");
    assert!(subs.contains(&2), "2-colour packed: {subs:?}");
    assert!(subs.contains(&5), "5-colour packed: {subs:?}");
    assert!(subs.contains(&0), "raw: {subs:?}");
    assert!(subs.contains(&128), "plain RLE: {subs:?}");
    assert!(subs.iter().any(|&s| s >= 130), "palette RLE: {subs:?}");

    // Later updates continue the same zlib stream.
    for round in 0..3u32 {
        let r = Rect::new(10 + round as u16 * 40, 100, 77, 61);
        let mut rng = Rng(round + 5);
        fill(&t.screen, r, |x, _| {
            if x % 7 == 0 {
                rng_next(&mut rng)
            } else {
                0x777777
            }
        });
        t.server.damage(&[r]);
        c.request(true, c.full());
        assert_eq!(
            c.read_update(),
            vec![Got {
                rect: r,
                encoding: 16
            }]
        );
        assert_eq!(c.fb, screen_values(&t.screen));
    }
    assert!(t.server.stats().rects_zrle >= 4);
}

fn rng_next(r: &mut Rng) -> u32 {
    r.next() & 0xffffff
}

#[test]
fn set_pixel_format_16bpp_big_endian() {
    let t = start(8, 2);
    let colours = [
        0xff0000, 0x00ff00, 0x0000ff, 0xffffff, 0x000000, 0x808080, 0x0000ff, 0xff0000,
    ];
    fill(&t.screen, Rect::new(0, 0, 8, 2), |x, _| colours[x]);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    let rgb565_be = Format {
        bpp: 16,
        depth: 16,
        big_endian: true,
        max: [31, 63, 31],
        shift: [11, 5, 0],
    };
    c.set_pixel_format(rgb565_be);
    c.set_encodings(&[0]);
    c.request(false, c.full());
    // Read the raw bytes ourselves to check the byte order.
    assert_eq!(read_n(&mut c.s, 4).unwrap(), [0, 0, 0, 1]);
    assert_eq!(
        read_n(&mut c.s, 12).unwrap(),
        [0, 0, 0, 0, 0, 8, 0, 2, 0, 0, 0, 0]
    );
    let row = read_n(&mut c.s, 16).unwrap();
    assert_eq!(
        row,
        [
            0xf8, 0x00, 0x07, 0xe0, 0x00, 0x1f, 0xff, 0xff, 0, 0, 0x84, 0x10, 0x00, 0x1f, 0xf8,
            0x00
        ]
    );
    read_n(&mut c.s, 16).unwrap();

    // The same format through ZRLE (2-byte CPIXELs).
    c.set_encodings(&[16]);
    c.request(false, c.full());
    c.read_update();
    let want: Vec<u32> = [0xf800, 0x07e0, 0x001f, 0xffff, 0, 0x8410, 0x001f, 0xf800].repeat(2);
    assert_eq!(c.fb, want);
}

#[test]
fn other_true_colour_formats() {
    let t = start(70, 66);
    paint(&t.screen, 3);
    let formats = [
        // 8 bpp BGR233.
        Format {
            bpp: 8,
            depth: 8,
            big_endian: false,
            max: [7, 7, 3],
            shift: [0, 3, 6],
        },
        // 32 bpp big-endian, colours in the high bytes (CPIXEL = top 3 bytes).
        Format {
            bpp: 32,
            depth: 24,
            big_endian: true,
            max: [255, 255, 255],
            shift: [24, 16, 8],
        },
        // 32 bpp with depth 32: CPIXEL is the full 4 bytes.
        Format {
            bpp: 32,
            depth: 32,
            big_endian: false,
            max: [1023, 1023, 1023],
            shift: [20, 10, 0],
        },
    ];
    for f in formats {
        let mut c = handshake(tcp(t.server.local_addr()), None);
        c.set_pixel_format(f);
        let scale = |v: u32, max: u16| (v * u32::from(max) + 127) / 255;
        let want: Vec<u32> = t
            .screen
            .read()
            .iter()
            .map(|p| {
                let ch = [(p >> 16) & 0xff, (p >> 8) & 0xff, p & 0xff];
                (0..3)
                    .map(|i| scale(ch[i], f.max[i]) << f.shift[i])
                    .fold(0, |a, b| a | b)
            })
            .collect();
        for enc in [0, 16] {
            c.set_encodings(&[enc]);
            c.request(false, c.full());
            c.read_update();
            assert_eq!(c.fb, want, "format {f:?} encoding {enc}");
            c.fb.iter_mut().for_each(|p| *p = 0);
        }
    }
}

/// Scrolls the screen content up by `dy` rows, as a guest would.
fn scroll_up(screen: &Screen, dy: usize) {
    let w = usize::from(screen.width());
    let mut px = screen.write();
    let len = px.len();
    px.copy_within(dy * w..len, 0);
}

#[test]
fn copyrect_when_only_copy_happened() {
    let (w, h) = (120u16, 90u16);
    let t = start(w, h);
    paint(&t.screen, 11);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.set_encodings(&[1, 0]);
    c.request(false, c.full());
    c.read_update();

    scroll_up(&t.screen, 10);
    t.server.copy(Rect::new(0, 10, w, h - 10), 0, 0);
    c.request(true, c.full());
    let got = c.read_update();
    assert_eq!(
        got,
        vec![Got {
            rect: Rect::new(0, 0, w, h - 10),
            encoding: 1
        }]
    );
    assert_eq!(c.fb, screen_values(&t.screen));
    assert_eq!(t.server.stats().rects_copyrect, 1);

    // Now a scroll with fresh content below it: the copy and the damage.
    scroll_up(&t.screen, 10);
    t.server.copy(Rect::new(0, 10, w, h - 10), 0, 0);
    let bottom = Rect::new(0, h - 10, w, 10);
    fill(&t.screen, bottom, |x, y| (x * 7 + y * 13) as u32);
    t.server.damage(&[bottom]);
    c.request(true, c.full());
    let got = c.read_update();
    assert_eq!(got[0].encoding, 1, "CopyRect comes first");
    assert_eq!(c.fb, screen_values(&t.screen));
}

#[test]
fn no_copyrect_over_pending_damage_or_without_support() {
    let (w, h) = (64u16, 64u16);
    let t = start(w, h);
    paint(&t.screen, 5);
    let mut with = handshake(tcp(t.server.local_addr()), None);
    with.set_encodings(&[1, 0]);
    with.request(false, with.full());
    with.read_update();
    let mut without = handshake(tcp(t.server.local_addr()), None);
    without.set_encodings(&[0]);
    without.request(false, without.full());
    without.read_update();

    // The source is damaged and not yet sent: copying it would copy stale
    // pixels, so the destination comes as pixels.
    let src = Rect::new(0, 32, 64, 32);
    fill(&t.screen, src, |x, y| (x + y) as u32 * 0x010101);
    t.server.damage(&[src]);
    {
        let mut px = t.screen.write();
        px.copy_within(32 * 64..64 * 64, 0);
    }
    t.server.copy(src, 0, 0);
    for c in [&mut with, &mut without] {
        c.request(true, c.full());
        let got = c.read_update();
        assert!(got.iter().all(|g| g.encoding == 0), "{got:?}");
        assert_eq!(c.fb, screen_values(&t.screen));
    }
    assert_eq!(t.server.stats().rects_copyrect, 0);
}

#[test]
fn copy_racing_with_an_update_stays_correct() {
    // The Screen is moved before copy() is called, and a client reads the
    // post-move pixels in between: the server must notice that the
    // CopyRect alone would be wrong.
    let (w, h) = (64u16, 64u16);
    let t = start(w, h);
    paint(&t.screen, 9);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.set_encodings(&[1, 0]);
    c.request(false, c.full());
    c.read_update();

    let area = Rect::new(0, 0, w, h);
    fill(&t.screen, area, |x, y| (x * 3 + y * 1000) as u32);
    t.server.damage(&[area]);
    // The guest scrolls before the client's request is served...
    scroll_up(&t.screen, 8);
    c.request(true, c.full());
    c.read_update();
    // ...and the copy is only reported now.
    t.server.copy(Rect::new(0, 8, w, h - 8), 0, 0);
    c.request(true, c.full());
    let got = c.read_update();
    assert_eq!(got[0].encoding, 1, "{got:?}");
    assert!(
        got[1..].iter().any(|g| g.encoding == 0),
        "the wrong pixels are resent: {got:?}"
    );
    assert_eq!(c.fb, screen_values(&t.screen));
}

#[test]
fn two_clients_both_get_updates() {
    let t = start(80, 60);
    paint(&t.screen, 1);
    let addr = t.server.local_addr();
    let screen = t.screen.clone();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = handshake(tcp(addr), None);
                c.set_encodings(if i == 0 { &[16] } else { &[0] });
                c.request(false, c.full());
                c.read_update();
                c.request(true, c.full());
                c.read_update();
                c
            })
        })
        .collect();
    eventually("two clients", || t.server.clients() == 2);
    // Keep damaging until both threads have their second update.
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads.iter().any(|h| !h.is_finished()) {
        assert!(Instant::now() < deadline);
        fill(&screen, Rect::new(5, 5, 20, 20), |_, _| 0x00ff00);
        t.server.damage(&[Rect::new(5, 5, 20, 20)]);
        std::thread::sleep(Duration::from_millis(10));
    }
    for h in threads {
        let c = h.join().unwrap();
        assert_eq!(c.fb, screen_values(&t.screen));
    }
}

#[test]
fn a_client_that_never_reads_does_not_block_damage() {
    let (w, h) = (1024u16, 768u16);
    let t = start(w, h);
    paint(&t.screen, 2);
    let mut stuck = handshake(tcp(t.server.local_addr()), None);
    stuck.set_encodings(&[0]);
    // Many full-screen requests, never read: megabytes of updates back up.
    for _ in 0..50 {
        stuck.request(false, stuck.full());
    }
    std::thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    for i in 0..2000u16 {
        t.server
            .damage(&[Rect::new(i % w, i % h, 16, 16), Rect::new(0, 0, w, h)]);
        t.server.copy(Rect::new(0, 1, w, h - 1), 0, 0);
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );

    // Others are served meanwhile.
    let mut other = handshake(tcp(t.server.local_addr()), None);
    other.set_encodings(&[16]);
    other.request(false, other.full());
    other.read_update();
    assert_eq!(other.fb, screen_values(&t.screen));
    drop(stuck);
}

#[test]
fn bad_messages_close_only_that_client() {
    let t = start(40, 30);
    paint(&t.screen, 4);
    let mut good = handshake(tcp(t.server.local_addr()), None);

    let bad_inputs: Vec<Vec<u8>> = vec![
        vec![0x99],
        vec![7, 0, 0, 0],
        // SetPixelFormat with a colour map.
        vec![0, 0, 0, 0, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        // SetPixelFormat 24 bpp.
        vec![
            0, 0, 0, 0, 24, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0,
        ],
        // ClientCutText claiming 2 GiB.
        vec![6, 0, 0, 0, 0x80, 0, 0, 0],
    ];
    for (i, bytes) in bad_inputs.iter().enumerate() {
        let mut bad = handshake(tcp(t.server.local_addr()), None);
        bad.s.write_all(bytes).unwrap();
        assert!(closed_by_server(&mut bad.s), "input {i} should close");
        eventually("refusal counted", || {
            t.server.stats().clients_refused == i as u64 + 1
        });
    }

    // Cut text within the limit is skipped, even split across writes.
    let mut cut = vec![6u8, 0, 0, 0, 0, 0, 0x10, 0];
    cut.extend(std::iter::repeat_n(b'x', 0x1000));
    good.s.write_all(&cut[..100]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    good.s.write_all(&cut[100..]).unwrap();
    good.request(false, good.full());
    good.read_update();
    assert_eq!(good.fb, screen_values(&t.screen));
    assert_eq!(t.server.clients(), 1);
}

#[test]
fn key_and_pointer_events_reach_the_sink() {
    let t = start(200, 100);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.key(true, 0xff0d);
    c.key(false, 0xff0d);
    c.pointer(1, 10, 20);
    c.pointer(0, 5000, 5000);
    // Messages are handled in order: once the update arrives, so did they.
    c.request(false, c.full());
    c.read_update();
    let events = t.input.events.lock().unwrap().clone();
    assert_eq!(
        events,
        vec![
            Event::Key(0xff0d, true),
            Event::Key(0xff0d, false),
            Event::Pointer(10, 20, 1),
            Event::Pointer(199, 99, 0),
        ]
    );
}

#[test]
fn websocket_handshake_and_update() {
    use tungstenite::client::IntoClientRequest;

    let t = start_with(50, 40, None, true);
    paint(&t.screen, 8);
    let addr = t.server.websocket_addr().expect("websocket listener");
    let mut request = format!("ws://{addr}/websockify")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "binary".parse().unwrap());
    let (ws, response) = tungstenite::client(request, tcp(addr)).expect("WebSocket upgrade");
    assert_eq!(
        response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .map(|v| v.to_str().unwrap()),
        Some("binary")
    );
    let mut c = handshake(client::WsStream::new(ws), None);
    c.set_encodings(&[16, 0]);
    c.request(false, c.full());
    c.read_update();
    assert_eq!(c.fb, screen_values(&t.screen));

    // A second update, with input arriving split across messages.
    let r = Rect::new(1, 2, 3, 4);
    fill(&t.screen, r, |_, _| 0x123456);
    t.server.damage(&[r]);
    c.s.write_all(&[3, 1, 0]).unwrap();
    c.s.write_all(&[0, 0, 0, 0, 50, 0, 40]).unwrap();
    assert_eq!(
        c.read_update(),
        vec![Got {
            rect: r,
            encoding: 16
        }]
    );
    assert_eq!(c.fb, screen_values(&t.screen));
}

#[test]
fn websocket_without_subprotocol() {
    let t = start_with(16, 16, None, true);
    let addr = t.server.websocket_addr().unwrap();
    let (ws, response) = tungstenite::client(format!("ws://{addr}/"), tcp(addr)).expect("upgrade");
    assert!(response.headers().get("Sec-WebSocket-Protocol").is_none());
    let mut c = handshake(client::WsStream::new(ws), None);
    c.request(false, c.full());
    c.read_update();
}

#[test]
fn shutdown_disconnects_clients() {
    let mut t = start(16, 16);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    let mut half = tcp(t.server.local_addr());
    read_n(&mut half, 12).unwrap();
    let started = Instant::now();
    t.server.shutdown();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(closed_by_server(&mut c.s));
    assert!(closed_by_server(&mut half));
    assert_eq!(t.server.clients(), 0);
    assert!(
        std::net::TcpStream::connect(t.server.local_addr()).is_err() || {
            // The port may be reused by the OS at once only in theory; a
            // connection that succeeds must at least get no RFB greeting.
            let mut s = tcp(t.server.local_addr());
            let mut b = [0u8; 1];
            !matches!(s.read(&mut b), Ok(1))
        }
    );
}

#[test]
fn address_in_use_is_an_error() {
    let t = start(8, 8);
    let config = VncConfig {
        listen: t.server.local_addr(),
        websocket: None,
        password: None,
        name: String::new(),
        front_door: super::FrontDoor::default(),
    };
    let input: Arc<dyn InputSink> = t.input.clone();
    assert!(VncServer::start(config, t.screen.clone(), input).is_err());
}

#[test]
fn stats_serialize() {
    let t = start(8, 8);
    let mut c = handshake(tcp(t.server.local_addr()), None);
    c.request(false, c.full());
    c.read_update();
    let st = t.server.stats();
    assert_eq!((st.connections, st.clients_accepted, st.updates), (1, 1, 1));
    assert!(st.encode_ns > 0);
    let json = serde_json::to_string(&st).unwrap();
    assert!(json.contains("\"rects_raw\":1"));
}

/// A WebSocket upgrade to `addr` with `origin` (None: no Origin header).
fn ws_upgrade(
    addr: SocketAddr,
    origin: Option<&str>,
) -> Result<client::WsStream, tungstenite::Error> {
    use tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{addr}/").into_client_request().unwrap();
    if let Some(origin) = origin {
        request
            .headers_mut()
            .insert("Origin", origin.parse().unwrap());
    }
    tungstenite::client(request, tcp(addr))
        .map(|(ws, _)| client::WsStream::new(ws))
        .map_err(|e| match e {
            tungstenite::HandshakeError::Failure(e) => e,
            tungstenite::HandshakeError::Interrupted(_) => panic!("blocking client interrupted"),
        })
}

#[test]
fn websocket_origin_is_checked() {
    let front_door = super::FrontDoor {
        origins: vec!["https://console.example:8443".into()],
        ..Default::default()
    };
    let t = start_front(16, 16, None, true, front_door);
    let addr = t.server.websocket_addr().unwrap();
    // Another page in the host's browser: 403, the reason in the body.
    match ws_upgrade(addr, Some("https://evil.example")) {
        Err(tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 403);
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(
                body.contains("\"https://evil.example\" is not allowed"),
                "{body}"
            );
            assert!(!body.contains('\n'), "{body}");
        }
        Err(e) => panic!("expected HTTP 403, got {e}"),
        Ok(_) => panic!("a foreign Origin was let in"),
    }
    eventually("the refusal counted", || {
        t.server.stats().clients_refused == 1
    });
    assert_eq!(t.server.clients(), 0);
    // No Origin (not a browser), our own, and a listed one get through.
    let own = format!("http://{addr}");
    for origin in [
        None,
        Some(own.as_str()),
        Some("https://console.example:8443"),
    ] {
        let ws = ws_upgrade(addr, origin).unwrap_or_else(|e| panic!("{origin:?}: {e}"));
        let mut c = handshake(ws, None);
        c.request(false, c.full());
        c.read_update();
    }
}

#[test]
fn an_idle_connection_is_closed_at_the_timeout_and_others_get_through() {
    let timeout = Duration::from_millis(600);
    let front_door = super::FrontDoor {
        handshake_timeout: timeout,
        ..Default::default()
    };
    let t = start_front(16, 16, Some("pw"), true, front_door);
    let opened = Instant::now();
    let mut idle = tcp(t.server.local_addr());
    let mut idle_ws = tcp(t.server.websocket_addr().unwrap());
    // A real client authenticates meanwhile.
    let mut c = handshake(tcp(t.server.local_addr()), Some("pw"));
    c.request(false, c.full());
    c.read_update();
    assert_eq!(read_n(&mut idle, 12).unwrap(), b"RFB 003.008\n");
    assert!(
        closed_by_server(&mut idle),
        "the idle RFB socket stays open"
    );
    assert!(
        closed_by_server(&mut idle_ws),
        "the idle WebSocket stays open"
    );
    let took = opened.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(3),
        "{took:?}"
    );
    // The real client was not held to the handshake's timeout.
    std::thread::sleep(timeout);
    c.request(false, c.full());
    c.read_update();
    assert_eq!(t.server.clients(), 1);
}

#[test]
fn connections_short_of_the_handshake_are_limited_per_address() {
    let front_door = super::FrontDoor {
        pending_per_address: 2,
        ..Default::default()
    };
    let t = start_front(16, 16, None, false, front_door);
    let addr = t.server.local_addr();
    let version = |s: &mut std::net::TcpStream| read_n(s, 12).map(|v| v == b"RFB 003.008\n");
    let mut idle_a = tcp(addr);
    assert!(version(&mut idle_a).unwrap());
    // A client that finishes the handshake no longer counts.
    let mut c = handshake(tcp(addr), None);
    let mut idle_b = tcp(addr);
    assert!(version(&mut idle_b).unwrap());
    // A third idle one from this address is turned away at once.
    let mut refused = tcp(addr);
    assert!(closed_by_server(&mut refused), "a third pending connection");
    eventually("the refusal counted", || {
        t.server.stats().clients_refused == 1
    });
    // The one that got through still works.
    c.request(false, c.full());
    c.read_update();
    // A pending one leaves: its place is free again.
    drop(idle_a);
    eventually("a place to free up", || {
        let mut s = tcp(addr);
        version(&mut s).unwrap_or(false)
    });
    drop(idle_b);
}

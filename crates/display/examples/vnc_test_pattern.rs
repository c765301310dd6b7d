//! A VNC server over a test picture, with no VM behind it: the display
//! crate's real RFB and WebSocket server, for checking real clients
//! (noVNC in a browser: tests/browser/novnc_test.py) without KVM.
//!
//! ```text
//! vnc_test_pattern [--width W] [--height H] [--password P] [--origin ORIGIN]...
//! ```
//!
//! `--origin` allows a WebSocket `Origin` (the page noVNC is served from,
//! another port than ours). Listens on 127.0.0.1 (RFB and WebSocket, free
//! ports) and prints one line
//! `listening rfb=ADDR websocket=ADDR`. Then it prints every input event a
//! client sends (`key KEYSYM 1|0`, `pointer X Y BUTTONS`), and reads
//! commands on stdin, one per line:
//!
//! - `fill X Y W H RRGGBB`: paint a rectangle and send it as damage;
//! - `move X Y W H DX DY`: move a rectangle (a CopyRect for clients that
//!   take it);
//! - `stats`: print the server's counters as `stats {JSON}`;
//! - `quit` (or end of input): stop.
//!
//! The picture (`pattern_pixel`): four quadrants (red, green, blue, white)
//! with a grey gradient band across the middle, so that a client that
//! swaps colour channels or rows shows the wrong pixel somewhere.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

use display::vnc::{VncConfig, VncServer};
use display::{InputSink, Rect, Screen};

/// The test picture's pixel at (`x`, `y`), as 0x00RRGGBB.
fn pattern_pixel(x: u16, y: u16, width: u16, height: u16) -> u32 {
    let band = height / 8;
    let mid = height / 2;
    if y >= mid - band / 2 && y < mid + band / 2 {
        let level = u32::from(x) * 255 / u32::from(width.max(2) - 1);
        return (level << 16) | (level << 8) | level;
    }
    match (x < width / 2, y < mid) {
        (true, true) => 0x00ff_0000,
        (false, true) => 0x0000_ff00,
        (true, false) => 0x0000_00ff,
        (false, false) => 0x00ff_ffff,
    }
}

/// Prints each input event on its own line, as it arrives.
struct PrintInput(Mutex<std::io::Stdout>);

impl PrintInput {
    fn line(&self, text: String) {
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

impl InputSink for PrintInput {
    fn key(&self, keysym: u32, down: bool) {
        self.line(format!("key {keysym:#x} {}", u8::from(down)));
    }
    fn pointer(&self, x: u16, y: u16, buttons: u8) {
        self.line(format!("pointer {x} {y} {buttons}"));
    }
}

struct Options {
    width: u16,
    height: u16,
    password: Option<String>,
    origins: Vec<String>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        width: 640,
        height: 480,
        password: None,
        origins: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--width" => options.width = parse_size(&value()?)?,
            "--height" => options.height = parse_size(&value()?)?,
            "--password" => options.password = Some(value()?),
            "--origin" => options.origins.push(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(options)
}

fn parse_size(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(n) if (16..=4096).contains(&n) => Ok(n),
        _ => Err(format!("bad size {text:?} (16..4096)")),
    }
}

/// Parses `N` numbers from `words`; the last may be hex (`hex_last`).
fn numbers<const N: usize>(words: &[&str], hex_last: bool) -> Option<[u32; N]> {
    if words.len() != N {
        return None;
    }
    let mut out = [0u32; N];
    for (i, word) in words.iter().enumerate() {
        out[i] = if hex_last && i == N - 1 {
            u32::from_str_radix(word, 16).ok()?
        } else {
            word.parse().ok()?
        };
    }
    Some(out)
}

/// The rectangle, clipped to the screen, or None if it is off screen.
fn clip(screen: &Screen, x: u32, y: u32, w: u32, h: u32) -> Option<Rect> {
    let (sw, sh) = (u32::from(screen.width()), u32::from(screen.height()));
    if x >= sw || y >= sh || w == 0 || h == 0 {
        return None;
    }
    let w = w.min(sw - x);
    let h = h.min(sh - y);
    Some(Rect::new(x as u16, y as u16, w as u16, h as u16))
}

fn fill(server: &VncServer, screen: &Screen, args: &[&str]) -> Result<(), String> {
    let [x, y, w, h, colour] = numbers::<5>(args, true).ok_or("usage: fill X Y W H RRGGBB")?;
    let rect = clip(screen, x, y, w, h).ok_or("the rectangle is off the screen")?;
    {
        let width = usize::from(screen.width());
        let mut pixels = screen.write();
        for row in rect.y..rect.y + rect.h {
            let start = usize::from(row) * width + usize::from(rect.x);
            pixels[start..start + usize::from(rect.w)].fill(colour & 0x00ff_ffff);
        }
    }
    server.damage(&[rect]);
    Ok(())
}

fn move_rect(server: &VncServer, screen: &Screen, args: &[&str]) -> Result<(), String> {
    let [x, y, w, h, dx, dy] = numbers::<6>(args, false).ok_or("usage: move X Y W H DX DY")?;
    let src = clip(screen, x, y, w, h).ok_or("the source is off the screen")?;
    let dst = clip(screen, dx, dy, u32::from(src.w), u32::from(src.h))
        .filter(|d| d.w == src.w && d.h == src.h)
        .ok_or("the destination does not fit on the screen")?;
    {
        let width = usize::from(screen.width());
        let mut pixels = screen.write();
        let copy: Vec<u32> = (src.y..src.y + src.h)
            .flat_map(|row| {
                let start = usize::from(row) * width + usize::from(src.x);
                pixels[start..start + usize::from(src.w)].to_vec()
            })
            .collect();
        for (i, row) in (dst.y..dst.y + dst.h).enumerate() {
            let start = usize::from(row) * width + usize::from(dst.x);
            let from = i * usize::from(src.w);
            pixels[start..start + usize::from(dst.w)]
                .copy_from_slice(&copy[from..from + usize::from(src.w)]);
        }
    }
    server.copy(src, dst.x, dst.y);
    Ok(())
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("vnc_test_pattern: {message}");
            std::process::exit(2);
        }
    };
    let screen = Arc::new(Screen::new(options.width, options.height));
    {
        let mut pixels = screen.write();
        for y in 0..options.height {
            for x in 0..options.width {
                pixels[usize::from(y) * usize::from(options.width) + usize::from(x)] =
                    pattern_pixel(x, y, options.width, options.height);
            }
        }
    }
    let input = Arc::new(PrintInput(Mutex::new(std::io::stdout())));
    let localhost = "127.0.0.1:0".parse().expect("a literal address");
    let config = VncConfig {
        listen: localhost,
        websocket: Some(localhost),
        password: options.password,
        name: "hakoniwa test pattern".into(),
        front_door: display::vnc::FrontDoor {
            origins: options.origins,
            ..Default::default()
        },
    };
    let server = match VncServer::start(config, screen.clone(), input.clone()) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("vnc_test_pattern: cannot start the VNC server: {e}");
            std::process::exit(1);
        }
    };
    let websocket = server
        .websocket_addr()
        .map_or_else(|| "none".to_string(), |a| a.to_string());
    input.line(format!(
        "listening rfb={} websocket={websocket}",
        server.local_addr()
    ));

    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let result = match words.split_first() {
            None => continue,
            Some((&"quit", _)) => break,
            Some((&"fill", args)) => fill(&server, &screen, args),
            Some((&"move", args)) => move_rect(&server, &screen, args),
            Some((&"stats", _)) => {
                let stats = serde_json::to_string(&server.stats()).unwrap_or_default();
                input.line(format!("stats {stats}"));
                continue;
            }
            Some((other, _)) => Err(format!("unknown command {other:?}")),
        };
        match result {
            Ok(()) => input.line("ok".into()),
            Err(message) => input.line(format!("error {message}")),
        }
    }
}

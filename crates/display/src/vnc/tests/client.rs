//! A small RFB client for the tests, written from RFC 6143 independently of
//! the server's encoders: it keeps its own framebuffer of pixel values in
//! the format it asked for.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use flate2::{Decompress, FlushDecompress};

use crate::geometry::Rect;

/// Longest any test waits for one read.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The pixel format fields the client needs to decode pixels.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub bpp: u8,
    pub depth: u8,
    pub big_endian: bool,
    pub max: [u16; 3],
    pub shift: [u8; 3],
}

impl Format {
    pub const XRGB_LE: Format = Format {
        bpp: 32,
        depth: 24,
        big_endian: false,
        max: [255, 255, 255],
        shift: [16, 8, 0],
    };

    pub fn wire(&self) -> [u8; 16] {
        let mut w = [0u8; 16];
        w[0] = self.bpp;
        w[1] = self.depth;
        w[2] = u8::from(self.big_endian);
        w[3] = 1;
        for i in 0..3 {
            w[4 + 2 * i..6 + 2 * i].copy_from_slice(&self.max[i].to_be_bytes());
            w[10 + i] = self.shift[i];
        }
        w
    }

    /// Bytes of a ZRLE CPIXEL and, when 3, whether they are the high ones.
    fn cpixel(&self) -> (usize, bool) {
        let mask: u64 = (0..3)
            .map(|i| u64::from(self.max[i]) << self.shift[i])
            .fold(0, |a, b| a | b);
        if self.bpp == 32 && self.depth <= 24 {
            if mask < 1 << 24 {
                return (3, false);
            }
            if mask & 0xff == 0 {
                return (3, true);
            }
        }
        (usize::from(self.bpp / 8), false)
    }
}

pub struct TestClient<S: Read + Write> {
    pub s: S,
    pub width: u16,
    pub height: u16,
    pub name: String,
    pub server_format: [u8; 16],
    pub format: Format,
    /// Pixel values in `format`, row-major.
    pub fb: Vec<u32>,
    zlib: Decompress,
    /// ZRLE subencodings seen, for tests that check the encoder's choices.
    pub zrle_subencodings: Vec<u8>,
}

pub fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

pub fn read_n<S: Read>(s: &mut S, n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

pub fn read_u8<S: Read>(s: &mut S) -> io::Result<u8> {
    Ok(read_n(s, 1)?[0])
}

pub fn read_u16<S: Read>(s: &mut S) -> io::Result<u16> {
    let b = read_n(s, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

pub fn read_u32<S: Read>(s: &mut S) -> io::Result<u32> {
    let b = read_n(s, 4)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn read_string<S: Read>(s: &mut S) -> io::Result<String> {
    let n = read_u32(s)? as usize;
    Ok(String::from_utf8_lossy(&read_n(s, n)?).into_owned())
}

/// True when the server has closed the connection (EOF or reset) within
/// the read timeout.
pub fn closed_by_server<S: Read>(s: &mut S) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Runs the 3.8 handshake with None or VNC authentication.
pub fn handshake<S: Read + Write>(mut s: S, password: Option<&str>) -> TestClient<S> {
    assert_eq!(read_n(&mut s, 12).unwrap(), b"RFB 003.008\n");
    s.write_all(b"RFB 003.008\n").unwrap();
    let n = read_u8(&mut s).unwrap();
    let types = read_n(&mut s, usize::from(n)).unwrap();
    match password {
        None => {
            assert_eq!(types, [1]);
            s.write_all(&[1]).unwrap();
        }
        Some(p) => {
            assert_eq!(types, [2]);
            s.write_all(&[2]).unwrap();
            let challenge: [u8; 16] = read_n(&mut s, 16).unwrap().try_into().unwrap();
            s.write_all(&super::super::auth::response(p, &challenge))
                .unwrap();
        }
    }
    assert_eq!(read_u32(&mut s).unwrap(), 0, "SecurityResult");
    client_init(s)
}

/// Sends ClientInit and reads ServerInit.
pub fn client_init<S: Read + Write>(mut s: S) -> TestClient<S> {
    s.write_all(&[1]).unwrap();
    let width = read_u16(&mut s).unwrap();
    let height = read_u16(&mut s).unwrap();
    let server_format: [u8; 16] = read_n(&mut s, 16).unwrap().try_into().unwrap();
    let name = read_string(&mut s).unwrap();
    TestClient {
        s,
        width,
        height,
        name,
        server_format,
        format: Format::XRGB_LE,
        fb: vec![0; usize::from(width) * usize::from(height)],
        zlib: Decompress::new(true),
        zrle_subencodings: Vec::new(),
    }
}

/// What one rectangle of an update was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Got {
    pub rect: Rect,
    pub encoding: i32,
}

impl<S: Read + Write> TestClient<S> {
    pub fn set_pixel_format(&mut self, f: Format) {
        let mut m = vec![0u8, 0, 0, 0];
        m.extend_from_slice(&f.wire());
        self.s.write_all(&m).unwrap();
        self.format = f;
    }

    pub fn set_encodings(&mut self, list: &[i32]) {
        let mut m = vec![2u8, 0];
        m.extend_from_slice(&(list.len() as u16).to_be_bytes());
        for e in list {
            m.extend_from_slice(&e.to_be_bytes());
        }
        self.s.write_all(&m).unwrap();
    }

    pub fn request(&mut self, incremental: bool, r: Rect) {
        let mut m = vec![3u8, u8::from(incremental)];
        for v in [r.x, r.y, r.w, r.h] {
            m.extend_from_slice(&v.to_be_bytes());
        }
        self.s.write_all(&m).unwrap();
    }

    pub fn full(&self) -> Rect {
        Rect::new(0, 0, self.width, self.height)
    }

    pub fn key(&mut self, down: bool, keysym: u32) {
        let mut m = vec![4u8, u8::from(down), 0, 0];
        m.extend_from_slice(&keysym.to_be_bytes());
        self.s.write_all(&m).unwrap();
    }

    pub fn pointer(&mut self, buttons: u8, x: u16, y: u16) {
        let mut m = vec![5u8, buttons];
        m.extend_from_slice(&x.to_be_bytes());
        m.extend_from_slice(&y.to_be_bytes());
        self.s.write_all(&m).unwrap();
    }

    fn pixel_from(&self, b: &[u8]) -> u32 {
        let mut v = 0u32;
        if self.format.big_endian {
            for &x in b {
                v = v << 8 | u32::from(x);
            }
        } else {
            for &x in b.iter().rev() {
                v = v << 8 | u32::from(x);
            }
        }
        v
    }

    fn read_pixel(&mut self) -> u32 {
        let b = read_n(&mut self.s, usize::from(self.format.bpp / 8)).unwrap();
        self.pixel_from(&b)
    }

    fn set(&mut self, x: usize, y: usize, v: u32) {
        let w = usize::from(self.width);
        self.fb[y * w + x] = v;
    }

    /// Reads one FramebufferUpdate and applies it to `fb`.
    pub fn read_update(&mut self) -> Vec<Got> {
        assert_eq!(read_u8(&mut self.s).unwrap(), 0, "message type");
        read_u8(&mut self.s).unwrap();
        let n = read_u16(&mut self.s).unwrap();
        let mut got = Vec::new();
        for _ in 0..n {
            let x = read_u16(&mut self.s).unwrap();
            let y = read_u16(&mut self.s).unwrap();
            let w = read_u16(&mut self.s).unwrap();
            let h = read_u16(&mut self.s).unwrap();
            let encoding = read_u32(&mut self.s).unwrap() as i32;
            let rect = Rect::new(x, y, w, h);
            assert!(
                rect.right() <= u32::from(self.width) && rect.bottom() <= u32::from(self.height)
            );
            match encoding {
                0 => {
                    for yy in 0..usize::from(h) {
                        for xx in 0..usize::from(w) {
                            let v = self.read_pixel();
                            self.set(usize::from(x) + xx, usize::from(y) + yy, v);
                        }
                    }
                }
                1 => {
                    let sx = usize::from(read_u16(&mut self.s).unwrap());
                    let sy = usize::from(read_u16(&mut self.s).unwrap());
                    let stride = usize::from(self.width);
                    let src: Vec<u32> = (0..usize::from(h))
                        .flat_map(|yy| {
                            let start = (sy + yy) * stride + sx;
                            self.fb[start..start + usize::from(w)].to_vec()
                        })
                        .collect();
                    for yy in 0..usize::from(h) {
                        for xx in 0..usize::from(w) {
                            let v = src[yy * usize::from(w) + xx];
                            self.set(usize::from(x) + xx, usize::from(y) + yy, v);
                        }
                    }
                }
                16 => self.read_zrle(rect),
                other => panic!("unexpected encoding {other}"),
            }
            got.push(Got { rect, encoding });
        }
        got
    }

    /// ZRLE (RFC 6143 7.7.6), decoded from the spec's description.
    fn read_zrle(&mut self, r: Rect) {
        let len = read_u32(&mut self.s).unwrap() as usize;
        let compressed = read_n(&mut self.s, len).unwrap();
        let mut data = Vec::with_capacity(len * 8 + 1024);
        let mut used = 0usize;
        loop {
            data.reserve(64 * 1024);
            let before = self.zlib.total_in();
            self.zlib
                .decompress_vec(&compressed[used..], &mut data, FlushDecompress::Sync)
                .expect("inflate");
            used += (self.zlib.total_in() - before) as usize;
            if used == compressed.len() && data.len() < data.capacity() {
                break;
            }
        }
        let (cp_len, high) = self.format.cpixel();
        let mut d = &data[..];
        let mut take = |n: usize| -> Vec<u8> {
            assert!(d.len() >= n, "ZRLE data too short");
            let (a, b) = d.split_at(n);
            d = b;
            a.to_vec()
        };
        let big = self.format.big_endian;
        let cpixel = |b: &[u8]| -> u32 {
            let mut v = 0u32;
            if big {
                for &x in b {
                    v = v << 8 | u32::from(x);
                }
            } else {
                for &x in b.iter().rev() {
                    v = v << 8 | u32::from(x);
                }
            }
            if high {
                v << 8
            } else {
                v
            }
        };
        let run_len = |take: &mut dyn FnMut(usize) -> Vec<u8>| -> usize {
            let mut n = 1;
            loop {
                let b = take(1)[0];
                n += usize::from(b);
                if b != 255 {
                    return n;
                }
            }
        };
        let mut ty = 0;
        while ty < usize::from(r.h) {
            let th = 64.min(usize::from(r.h) - ty);
            let mut tx = 0;
            while tx < usize::from(r.w) {
                let tw = 64.min(usize::from(r.w) - tx);
                let sub = take(1)[0];
                self.zrle_subencodings.push(sub);
                let mut tile: Vec<u32> = Vec::with_capacity(tw * th);
                match sub {
                    0 => {
                        for _ in 0..tw * th {
                            tile.push(cpixel(&take(cp_len)));
                        }
                    }
                    1 => {
                        let c = cpixel(&take(cp_len));
                        tile.resize(tw * th, c);
                    }
                    2..=16 => {
                        let palette: Vec<u32> = (0..sub).map(|_| cpixel(&take(cp_len))).collect();
                        let bits = match sub {
                            2 => 1,
                            3 | 4 => 2,
                            _ => 4,
                        };
                        for _ in 0..th {
                            let row = take((tw * bits).div_ceil(8));
                            for i in 0..tw {
                                let bit = i * bits;
                                let byte = row[bit / 8];
                                let index = (byte >> (8 - bits - bit % 8)) & ((1 << bits) - 1);
                                tile.push(palette[usize::from(index)]);
                            }
                        }
                    }
                    128 => {
                        while tile.len() < tw * th {
                            let c = cpixel(&take(cp_len));
                            let n = run_len(&mut take);
                            tile.extend(std::iter::repeat_n(c, n));
                        }
                    }
                    130..=255 => {
                        let palette: Vec<u32> =
                            (0..sub - 128).map(|_| cpixel(&take(cp_len))).collect();
                        while tile.len() < tw * th {
                            let i = take(1)[0];
                            let c = palette[usize::from(i & 127)];
                            let n = if i & 128 != 0 { run_len(&mut take) } else { 1 };
                            tile.extend(std::iter::repeat_n(c, n));
                        }
                    }
                    other => panic!("invalid ZRLE subencoding {other}"),
                }
                assert_eq!(tile.len(), tw * th, "tile overran (subencoding {sub})");
                for yy in 0..th {
                    for xx in 0..tw {
                        let v = tile[yy * tw + xx];
                        self.set(usize::from(r.x) + tx + xx, usize::from(r.y) + ty + yy, v);
                    }
                }
                tx += 64;
            }
            ty += 64;
        }
        assert!(d.is_empty(), "{} bytes left after the tiles", d.len());
    }
}

/// A WebSocket carrying RFB, as a byte stream for [`TestClient`].
pub struct WsStream {
    pub ws: tungstenite::WebSocket<TcpStream>,
    buf: Vec<u8>,
    pos: usize,
}

impl WsStream {
    pub fn new(ws: tungstenite::WebSocket<TcpStream>) -> WsStream {
        WsStream {
            ws,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for WsStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.ws.read() {
                Ok(tungstenite::Message::Binary(b)) => {
                    self.buf = b.to_vec();
                    self.pos = 0;
                }
                Ok(tungstenite::Message::Close(_)) => return Ok(0),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) => return Err(e),
                Err(e) => return Err(io::Error::other(e)),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for WsStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.ws
            .send(tungstenite::Message::Binary(data.to_vec().into()))
            .map_err(io::Error::other)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ws.flush().map_err(io::Error::other)
    }
}

//! ZRLE encoding (RFC 6143 7.7.6).
//!
//! A rectangle is cut into 64x64 tiles (left to right, top to bottom).
//! Each tile is sent as whichever of these is smallest: raw CPIXELs, one
//! solid colour, a packed palette (2 to 16 colours, 1/2/4-bit indices), a
//! palette RLE (2 to 127 colours) or plain RLE. The tile bytes of one
//! rectangle go through a zlib stream that lives as long as the connection
//! (the client keeps one inflater for the whole session, so the server
//! must keep one deflater), ending with a sync flush so the client can
//! decode the rectangle without waiting for more.

use std::io;

use flate2::{Compress, Compression, FlushCompress};

use crate::vnc::pixel_format::PixelConverter;

/// Tile side, fixed by the spec.
const TILE: usize = 64;

/// Most colours a palette subencoding can carry (palette RLE's limit).
const MAX_PALETTE: usize = 127;

/// Packed palettes stop at 16 colours (4-bit indices).
const MAX_PACKED: usize = 16;

/// zlib level. Level 1 measured about 4x faster than zlib's default (6)
/// on a 1024x768 mixed picture for under 1 % more bytes: encoding time is
/// what an update costs here, and the screen content the tiles leave for
/// zlib (noise, gradients) gains little from harder work. Fixed, because
/// the backend cannot change level mid-stream and the stream must last.
const ZLIB_LEVEL: u32 = 1;

/// Subencoding numbers.
const RAW: u8 = 0;
const SOLID: u8 = 1;
const PLAIN_RLE: u8 = 128;

/// One client's ZRLE state.
pub struct ZrleEncoder {
    zlib: Compress,
    /// Uncompressed tile data of the rectangle being encoded.
    tiles: Vec<u8>,
    /// One tile's pixel values in the client's format.
    values: Vec<u32>,
    palette: Palette,
}

impl Default for ZrleEncoder {
    fn default() -> Self {
        ZrleEncoder::new()
    }
}

impl ZrleEncoder {
    pub fn new() -> ZrleEncoder {
        ZrleEncoder {
            zlib: Compress::new(Compression::new(ZLIB_LEVEL), true),
            tiles: Vec::new(),
            values: Vec::with_capacity(TILE * TILE),
            palette: Palette::new(),
        }
    }

    /// Appends the ZRLE data (length and zlib bytes) of a `w` x `h`
    /// rectangle whose Screen pixels are `rgb`, row-major.
    pub fn encode(
        &mut self,
        rgb: &[u32],
        w: usize,
        h: usize,
        converter: &PixelConverter,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        if rgb.len() < w * h {
            return Err(io::Error::other(
                "ZRLE: fewer pixels than the rectangle holds",
            ));
        }
        self.tiles.clear();
        // An empty rectangle has no tiles (and `chunks(0)` would panic).
        let h = if w == 0 { 0 } else { h };
        for ty in (0..h).step_by(TILE) {
            let th = TILE.min(h - ty);
            for tx in (0..w).step_by(TILE) {
                let tw = TILE.min(w - tx);
                self.values.clear();
                for row in rgb[ty * w..].chunks(w).take(th) {
                    self.values
                        .extend(row[tx..tx + tw].iter().map(|&p| converter.value(p)));
                }
                encode_tile(
                    &self.values,
                    tw,
                    th,
                    converter,
                    &mut self.palette,
                    &mut self.tiles,
                );
            }
        }

        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        let start = out.len();
        self.deflate(out)?;
        let len = u32::try_from(out.len() - start)
            .map_err(|_| io::Error::other("ZRLE: rectangle data over 4 GiB"))?;
        out[len_at..start].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    /// Compresses `self.tiles` onto `out`, ending with a sync flush.
    fn deflate(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let input = &self.tiles;
        let mut used = 0usize;
        loop {
            // compress_vec only writes into spare capacity.
            out.reserve((input.len() - used) / 2 + 1024);
            let before = self.zlib.total_in();
            self.zlib
                .compress_vec(&input[used..], out, FlushCompress::Sync)
                .map_err(io::Error::other)?;
            used += usize::try_from(self.zlib.total_in() - before).map_err(io::Error::other)?;
            // The flush is complete once all input is in and zlib stopped
            // with room to spare.
            if used >= input.len() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

/// Run statistics and palette of one tile, to price each subencoding.
struct TileShape {
    /// Palette fits (at most MAX_PALETTE colours).
    palette_ok: bool,
    colours: usize,
    /// Bytes of plain RLE runs, CPIXELs included.
    plain_rle: usize,
    /// Bytes of palette RLE runs, palette excluded.
    palette_rle: usize,
}

fn rle_length_bytes(run: usize) -> usize {
    (run - 1) / 255 + 1
}

/// Appends a run length: (length - 1) as bytes of 255 and a final byte
/// below 255, summed.
fn put_rle_length(out: &mut Vec<u8>, run: usize) {
    let mut rest = run - 1;
    while rest >= 255 {
        out.push(255);
        rest -= 255;
    }
    out.push(rest as u8);
}

/// Calls `f(value, run length)` for each run of equal values. Runs go on
/// across row ends: ZRLE's RLE treats the tile as one sequence.
fn for_each_run(values: &[u32], mut f: impl FnMut(u32, usize)) {
    let mut iter = values.iter();
    let Some(&first) = iter.next() else {
        return;
    };
    let (mut current, mut run) = (first, 1usize);
    for &v in iter {
        if v == current {
            run += 1;
        } else {
            f(current, run);
            current = v;
            run = 1;
        }
    }
    f(current, run);
}

fn analyse(values: &[u32], cpixel: usize, palette: &mut Palette) -> TileShape {
    palette.clear();
    let mut shape = TileShape {
        palette_ok: true,
        colours: 0,
        plain_rle: 0,
        palette_rle: 0,
    };
    for_each_run(values, |v, run| {
        if shape.palette_ok && palette.insert(v).is_none() {
            shape.palette_ok = false;
        }
        let len_bytes = rle_length_bytes(run);
        shape.plain_rle += cpixel + len_bytes;
        shape.palette_rle += if run == 1 { 1 } else { 1 + len_bytes };
    });
    shape.colours = palette.len();
    shape
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Choice {
    Raw,
    Solid,
    Packed,
    PaletteRle,
    PlainRle,
}

fn packed_bits(colours: usize) -> usize {
    match colours {
        0..=2 => 1,
        3..=4 => 2,
        _ => 4,
    }
}

fn encode_tile(
    values: &[u32],
    w: usize,
    h: usize,
    converter: &PixelConverter,
    palette: &mut Palette,
    out: &mut Vec<u8>,
) {
    let cp = converter.cpixel_len();
    let shape = analyse(values, cp, palette);

    let mut best = (Choice::Raw, values.len() * cp);
    let mut consider = |choice: Choice, cost: usize| {
        if cost < best.1 {
            best = (choice, cost);
        }
    };
    if shape.palette_ok {
        let n = shape.colours;
        if n == 1 {
            consider(Choice::Solid, cp);
        } else {
            if n <= MAX_PACKED {
                let row_bytes = (w * packed_bits(n)).div_ceil(8);
                consider(Choice::Packed, n * cp + h * row_bytes);
            }
            consider(Choice::PaletteRle, n * cp + shape.palette_rle);
        }
    }
    consider(Choice::PlainRle, shape.plain_rle);

    match best.0 {
        Choice::Raw => {
            out.push(RAW);
            for &v in values {
                converter.put_cpixel(out, v);
            }
        }
        Choice::Solid => {
            out.push(SOLID);
            converter.put_cpixel(out, values[0]);
        }
        Choice::Packed => {
            out.push(shape.colours as u8);
            put_palette(out, palette, converter);
            let bits = packed_bits(shape.colours);
            for row in values.chunks(w) {
                // Indices most significant bits first; rows start on a
                // byte boundary.
                let (mut byte, mut used) = (0u8, 0usize);
                for &v in row {
                    byte |= palette.index(v) << (8 - bits - used);
                    used += bits;
                    if used == 8 {
                        out.push(byte);
                        (byte, used) = (0, 0);
                    }
                }
                if used > 0 {
                    out.push(byte);
                }
            }
        }
        Choice::PaletteRle => {
            out.push(128 + shape.colours as u8);
            put_palette(out, palette, converter);
            for_each_run(values, |v, run| {
                let index = palette.index(v);
                if run == 1 {
                    out.push(index);
                } else {
                    out.push(index | 128);
                    put_rle_length(out, run);
                }
            });
        }
        Choice::PlainRle => {
            out.push(PLAIN_RLE);
            for_each_run(values, |v, run| {
                converter.put_cpixel(out, v);
                put_rle_length(out, run);
            });
        }
    }
}

fn put_palette(out: &mut Vec<u8>, palette: &Palette, converter: &PixelConverter) {
    for &c in &palette.colours {
        converter.put_cpixel(out, c);
    }
}

/// A tile's distinct colours with their indices: a small open-addressing
/// hash table, because a linear search per pixel would cost up to 127
/// comparisons on busy tiles.
struct Palette {
    colours: Vec<u32>,
    /// 0 = empty, else palette index + 1.
    slots: [u8; Palette::SLOTS],
}

impl Palette {
    /// A power of two at least twice MAX_PALETTE, so probes stay short.
    const SLOTS: usize = 256;

    fn new() -> Palette {
        Palette {
            colours: Vec::with_capacity(MAX_PALETTE),
            slots: [0; Palette::SLOTS],
        }
    }

    fn clear(&mut self) {
        self.colours.clear();
        self.slots = [0; Palette::SLOTS];
    }

    fn len(&self) -> usize {
        self.colours.len()
    }

    fn home(v: u32) -> usize {
        (v.wrapping_mul(0x9e37_79b1) >> 24) as usize
    }

    /// The slot holding `v`, or the empty slot where it would go. The
    /// table is never more than half full, so an empty slot exists.
    fn find(&self, v: u32) -> usize {
        let mut i = Palette::home(v);
        loop {
            match self.slots[i] {
                0 => return i,
                s if self.colours[usize::from(s - 1)] == v => return i,
                _ => i = (i + 1) % Palette::SLOTS,
            }
        }
    }

    /// Adds `v` if new; `None` when the palette is already full.
    fn insert(&mut self, v: u32) -> Option<u8> {
        let i = self.find(v);
        if self.slots[i] != 0 {
            return Some(self.slots[i] - 1);
        }
        if self.colours.len() >= MAX_PALETTE {
            return None;
        }
        self.colours.push(v);
        self.slots[i] = self.colours.len() as u8;
        Some(self.slots[i] - 1)
    }

    /// Index of a colour known to be in the palette.
    fn index(&self, v: u32) -> u8 {
        self.slots[self.find(v)].saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rle_lengths() {
        for (run, want) in [
            (1usize, vec![0u8]),
            (255, vec![254]),
            (256, vec![255, 0]),
            (510, vec![255, 254]),
            (511, vec![255, 255, 0]),
        ] {
            let mut out = Vec::new();
            put_rle_length(&mut out, run);
            assert_eq!(out, want, "run {run}");
            assert_eq!(rle_length_bytes(run), want.len());
        }
    }

    #[test]
    fn palette_indices_are_stable() {
        let mut p = Palette::new();
        for v in 0..MAX_PALETTE as u32 {
            assert_eq!(p.insert(v * 0x0101_0101), Some(v as u8));
        }
        assert_eq!(p.insert(0xdead_beef), None);
        for v in 0..MAX_PALETTE as u32 {
            assert_eq!(p.index(v * 0x0101_0101), v as u8);
        }
    }

    #[test]
    fn picks_solid_and_packed() {
        let conv = PixelConverter::new(&crate::vnc::pixel_format::PixelFormat::SERVER);
        let mut pal = Palette::new();
        let mut out = Vec::new();
        encode_tile(&[0x123456; 16], 4, 4, &conv, &mut pal, &mut out);
        assert_eq!(out, [SOLID, 0x56, 0x34, 0x12]);

        // A checkerboard of two colours: packed, 1 bit, MSB first.
        let values: Vec<u32> = (0..16)
            .map(|i| if (i + i / 4) % 2 == 0 { 0 } else { 0xffffff })
            .collect();
        out.clear();
        encode_tile(&values, 4, 4, &conv, &mut pal, &mut out);
        assert_eq!(out[0], 2);
        assert_eq!(&out[1..7], &[0, 0, 0, 0xff, 0xff, 0xff]);
        assert_eq!(
            &out[7..],
            &[0b0101_0000, 0b1010_0000, 0b0101_0000, 0b1010_0000]
        );
    }
}

//! RFB pixel formats (RFC 6143 section 7.4) and the conversion from the
//! [`Screen`](crate::Screen)'s 0x00RRGGBB pixels to whatever true-colour
//! format a client asked for.

/// A PIXEL_FORMAT as it travels on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PixelFormat {
    pub bits_per_pixel: u8,
    pub depth: u8,
    pub big_endian: bool,
    pub true_colour: bool,
    pub red_max: u16,
    pub green_max: u16,
    pub blue_max: u16,
    pub red_shift: u8,
    pub green_shift: u8,
    pub blue_shift: u8,
}

impl PixelFormat {
    /// What the server announces in ServerInit: the Screen's own layout, so
    /// clients that keep it need no conversion at all.
    pub const SERVER: PixelFormat = PixelFormat {
        bits_per_pixel: 32,
        depth: 24,
        big_endian: false,
        true_colour: true,
        red_max: 255,
        green_max: 255,
        blue_max: 255,
        red_shift: 16,
        green_shift: 8,
        blue_shift: 0,
    };

    /// Size of a PIXEL_FORMAT on the wire.
    pub const WIRE_LEN: usize = 16;

    pub fn from_wire(b: &[u8; Self::WIRE_LEN]) -> PixelFormat {
        PixelFormat {
            bits_per_pixel: b[0],
            depth: b[1],
            big_endian: b[2] != 0,
            true_colour: b[3] != 0,
            red_max: u16::from_be_bytes([b[4], b[5]]),
            green_max: u16::from_be_bytes([b[6], b[7]]),
            blue_max: u16::from_be_bytes([b[8], b[9]]),
            red_shift: b[10],
            green_shift: b[11],
            blue_shift: b[12],
        }
    }

    pub fn to_wire(&self) -> [u8; Self::WIRE_LEN] {
        let r = self.red_max.to_be_bytes();
        let g = self.green_max.to_be_bytes();
        let b = self.blue_max.to_be_bytes();
        [
            self.bits_per_pixel,
            self.depth,
            u8::from(self.big_endian),
            u8::from(self.true_colour),
            r[0],
            r[1],
            g[0],
            g[1],
            b[0],
            b[1],
            self.red_shift,
            self.green_shift,
            self.blue_shift,
            0,
            0,
            0,
        ]
    }

    /// Whether this server can send pixels in this format. Colour maps are
    /// refused because the Screen is true colour and building a palette for
    /// a client is not worth it; the spec only allows 8, 16 and 32 bpp.
    pub fn check_supported(&self) -> Result<(), String> {
        if !self.true_colour {
            return Err("colour-map pixel formats are not supported".to_string());
        }
        if !matches!(self.bits_per_pixel, 8 | 16 | 32) {
            return Err(format!(
                "bits-per-pixel {} is not 8, 16 or 32",
                self.bits_per_pixel
            ));
        }
        Ok(())
    }

    pub fn bytes_per_pixel(&self) -> usize {
        usize::from(self.bits_per_pixel / 8)
    }

    /// Every bit a colour can set, as a pixel value.
    fn colour_mask(&self) -> u32 {
        let place = |max: u16, shift: u8| u32::from(max).checked_shl(u32::from(shift)).unwrap_or(0);
        place(self.red_max, self.red_shift)
            | place(self.green_max, self.green_shift)
            | place(self.blue_max, self.blue_shift)
    }
}

/// How ZRLE's CPIXEL relates to a PIXEL for one format (RFC 6143 7.7.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CPixel {
    /// CPIXEL is the whole PIXEL.
    Full,
    /// CPIXEL is the 3 least significant bytes, in the format's byte order.
    Low3,
    /// CPIXEL is the 3 most significant bytes, in the format's byte order.
    High3,
}

/// Turns Screen pixels into a client's pixel values and bytes. Built once
/// per SetPixelFormat; per-channel tables make the per-pixel work three
/// lookups whatever maxes and shifts the client chose.
pub struct PixelConverter {
    format: PixelFormat,
    red: Box<[u32; 256]>,
    green: Box<[u32; 256]>,
    blue: Box<[u32; 256]>,
    /// The format is the Screen's own: values are the Screen's pixels.
    identity: bool,
    cpixel: CPixel,
}

impl PixelConverter {
    /// `format` must have passed [`PixelFormat::check_supported`].
    pub fn new(format: &PixelFormat) -> PixelConverter {
        let value_mask = match format.bits_per_pixel {
            8 => 0xff,
            16 => 0xffff,
            _ => u32::MAX,
        };
        let table = |max: u16, shift: u8| {
            let mut t = Box::new([0u32; 256]);
            for (i, slot) in t.iter_mut().enumerate() {
                // Scale 0..=255 to 0..=max, rounding to nearest.
                let scaled = (i as u32 * u32::from(max) + 127) / 255;
                *slot = scaled.checked_shl(u32::from(shift)).unwrap_or(0) & value_mask;
            }
            t
        };
        let mask = format.colour_mask();
        let cpixel = if format.true_colour && format.bits_per_pixel == 32 && format.depth <= 24 {
            if mask & 0xff00_0000 == 0 {
                CPixel::Low3
            } else if mask & 0x0000_00ff == 0 {
                CPixel::High3
            } else {
                CPixel::Full
            }
        } else {
            CPixel::Full
        };
        PixelConverter {
            format: *format,
            red: table(format.red_max, format.red_shift),
            green: table(format.green_max, format.green_shift),
            blue: table(format.blue_max, format.blue_shift),
            identity: *format == PixelFormat::SERVER,
            cpixel,
        }
    }

    /// The client's pixel value for a Screen pixel (0x00RRGGBB).
    #[inline]
    pub fn value(&self, rgb: u32) -> u32 {
        if self.identity {
            return rgb & 0x00ff_ffff;
        }
        self.red[((rgb >> 16) & 0xff) as usize]
            | self.green[((rgb >> 8) & 0xff) as usize]
            | self.blue[(rgb & 0xff) as usize]
    }

    pub fn bytes_per_pixel(&self) -> usize {
        self.format.bytes_per_pixel()
    }

    /// Appends a pixel value as a PIXEL.
    #[inline]
    pub fn put_pixel(&self, out: &mut Vec<u8>, v: u32) {
        let big = self.format.big_endian;
        match self.format.bits_per_pixel {
            8 => out.push(v as u8),
            16 if big => out.extend_from_slice(&(v as u16).to_be_bytes()),
            16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            _ if big => out.extend_from_slice(&v.to_be_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }

    /// Bytes in one ZRLE CPIXEL.
    pub fn cpixel_len(&self) -> usize {
        match self.cpixel {
            CPixel::Full => self.bytes_per_pixel(),
            CPixel::Low3 | CPixel::High3 => 3,
        }
    }

    /// Appends a pixel value as a ZRLE CPIXEL.
    #[inline]
    pub fn put_cpixel(&self, out: &mut Vec<u8>, v: u32) {
        let three = match self.cpixel {
            CPixel::Full => return self.put_pixel(out, v),
            CPixel::Low3 => v,
            CPixel::High3 => v >> 8,
        };
        let b = three.to_le_bytes();
        if self.format.big_endian {
            out.extend_from_slice(&[b[2], b[1], b[0]]);
        } else {
            out.extend_from_slice(&[b[0], b[1], b[2]]);
        }
    }

    /// Appends Screen pixels as PIXELs.
    pub fn put_pixels(&self, out: &mut Vec<u8>, rgb: &[u32]) {
        out.reserve(rgb.len() * self.bytes_per_pixel());
        if self.identity {
            // The Screen's own layout is 32 bpp little-endian: copy bytes.
            for p in rgb {
                out.extend_from_slice(&(p & 0x00ff_ffff).to_le_bytes());
            }
            return;
        }
        for &p in rgb {
            self.put_pixel(out, self.value(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgb565_be() -> PixelFormat {
        PixelFormat {
            bits_per_pixel: 16,
            depth: 16,
            big_endian: true,
            true_colour: true,
            red_max: 31,
            green_max: 63,
            blue_max: 31,
            red_shift: 11,
            green_shift: 5,
            blue_shift: 0,
        }
    }

    #[test]
    fn wire_round_trip() {
        let f = rgb565_be();
        assert_eq!(PixelFormat::from_wire(&f.to_wire()), f);
        assert_eq!(
            PixelFormat::SERVER.to_wire(),
            [32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]
        );
    }

    #[test]
    fn converts_to_565_big_endian() {
        let c = PixelConverter::new(&rgb565_be());
        let mut out = Vec::new();
        c.put_pixels(&mut out, &[0xff0000, 0x00ff00, 0x0000ff, 0xffffff, 0]);
        assert_eq!(out, [0xf8, 0x00, 0x07, 0xe0, 0x00, 0x1f, 0xff, 0xff, 0, 0]);
    }

    #[test]
    fn identity_is_bgrx() {
        let c = PixelConverter::new(&PixelFormat::SERVER);
        let mut out = Vec::new();
        c.put_pixels(&mut out, &[0xff11_2233]);
        assert_eq!(out, [0x33, 0x22, 0x11, 0]);
        assert_eq!(c.cpixel_len(), 3);
        let mut cp = Vec::new();
        c.put_cpixel(&mut cp, c.value(0x112233));
        assert_eq!(cp, [0x33, 0x22, 0x11]);
    }

    #[test]
    fn cpixel_high_bytes_big_endian() {
        // RGB in the top three bytes, big-endian: wire PIXEL is R G B 0,
        // CPIXEL is R G B.
        let f = PixelFormat {
            big_endian: true,
            red_shift: 24,
            green_shift: 16,
            blue_shift: 8,
            ..PixelFormat::SERVER
        };
        let c = PixelConverter::new(&f);
        assert_eq!(c.cpixel_len(), 3);
        let mut px = Vec::new();
        c.put_pixel(&mut px, c.value(0x112233));
        assert_eq!(px, [0x11, 0x22, 0x33, 0]);
        let mut cp = Vec::new();
        c.put_cpixel(&mut cp, c.value(0x112233));
        assert_eq!(cp, [0x11, 0x22, 0x33]);
    }

    #[test]
    fn depth_32_keeps_full_cpixel() {
        let f = PixelFormat {
            depth: 32,
            ..PixelFormat::SERVER
        };
        assert_eq!(PixelConverter::new(&f).cpixel_len(), 4);
    }

    #[test]
    fn absurd_shifts_do_not_panic() {
        let f = PixelFormat {
            bits_per_pixel: 8,
            depth: 8,
            red_shift: 200,
            green_shift: 31,
            blue_shift: 7,
            red_max: 65535,
            green_max: 65535,
            blue_max: 65535,
            ..PixelFormat::SERVER
        };
        let c = PixelConverter::new(&f);
        let mut out = Vec::new();
        c.put_pixels(&mut out, &[0xffffff, 0x123456]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn refuses_colour_maps_and_odd_depths() {
        let mut f = PixelFormat::SERVER;
        f.true_colour = false;
        assert!(f.check_supported().is_err());
        let mut f = PixelFormat::SERVER;
        f.bits_per_pixel = 24;
        assert!(f.check_supported().is_err());
        assert!(rgb565_be().check_supported().is_ok());
    }
}

//! X11 keysyms (what RFB KeyEvents carry) to Linux input key codes (what a
//! virtio-input keyboard reports), for a US keyboard layout.
//!
//! RFB sends the symbol a key produced, not the key: an 'A' keysym means
//! shift was involved. The second value returned says the key needs shift
//! on a US layout, so the caller can synthesise shift if the client did
//! not send one.

/// Linux `KEY_*` codes (include/uapi/linux/input-event-codes.h).
mod key {
    pub const ESC: u16 = 1;
    pub const N1: u16 = 2;
    pub const N2: u16 = 3;
    pub const N3: u16 = 4;
    pub const N4: u16 = 5;
    pub const N5: u16 = 6;
    pub const N6: u16 = 7;
    pub const N7: u16 = 8;
    pub const N8: u16 = 9;
    pub const N9: u16 = 10;
    pub const N0: u16 = 11;
    pub const MINUS: u16 = 12;
    pub const EQUAL: u16 = 13;
    pub const BACKSPACE: u16 = 14;
    pub const TAB: u16 = 15;
    pub const Q: u16 = 16;
    pub const W: u16 = 17;
    pub const E: u16 = 18;
    pub const R: u16 = 19;
    pub const T: u16 = 20;
    pub const Y: u16 = 21;
    pub const U: u16 = 22;
    pub const I: u16 = 23;
    pub const O: u16 = 24;
    pub const P: u16 = 25;
    pub const LEFTBRACE: u16 = 26;
    pub const RIGHTBRACE: u16 = 27;
    pub const ENTER: u16 = 28;
    pub const LEFTCTRL: u16 = 29;
    pub const A: u16 = 30;
    pub const S: u16 = 31;
    pub const D: u16 = 32;
    pub const F: u16 = 33;
    pub const G: u16 = 34;
    pub const H: u16 = 35;
    pub const J: u16 = 36;
    pub const K: u16 = 37;
    pub const L: u16 = 38;
    pub const SEMICOLON: u16 = 39;
    pub const APOSTROPHE: u16 = 40;
    pub const GRAVE: u16 = 41;
    pub const LEFTSHIFT: u16 = 42;
    pub const BACKSLASH: u16 = 43;
    pub const Z: u16 = 44;
    pub const X: u16 = 45;
    pub const C: u16 = 46;
    pub const V: u16 = 47;
    pub const B: u16 = 48;
    pub const N: u16 = 49;
    pub const M: u16 = 50;
    pub const COMMA: u16 = 51;
    pub const DOT: u16 = 52;
    pub const SLASH: u16 = 53;
    pub const RIGHTSHIFT: u16 = 54;
    pub const KPASTERISK: u16 = 55;
    pub const LEFTALT: u16 = 56;
    pub const SPACE: u16 = 57;
    pub const CAPSLOCK: u16 = 58;
    pub const F1: u16 = 59;
    pub const F2: u16 = 60;
    pub const F3: u16 = 61;
    pub const F4: u16 = 62;
    pub const F5: u16 = 63;
    pub const F6: u16 = 64;
    pub const F7: u16 = 65;
    pub const F8: u16 = 66;
    pub const F9: u16 = 67;
    pub const F10: u16 = 68;
    pub const NUMLOCK: u16 = 69;
    pub const SCROLLLOCK: u16 = 70;
    pub const KP7: u16 = 71;
    pub const KP8: u16 = 72;
    pub const KP9: u16 = 73;
    pub const KPMINUS: u16 = 74;
    pub const KP4: u16 = 75;
    pub const KP5: u16 = 76;
    pub const KP6: u16 = 77;
    pub const KPPLUS: u16 = 78;
    pub const KP1: u16 = 79;
    pub const KP2: u16 = 80;
    pub const KP3: u16 = 81;
    pub const KP0: u16 = 82;
    pub const KPDOT: u16 = 83;
    pub const F11: u16 = 87;
    pub const F12: u16 = 88;
    pub const KPENTER: u16 = 96;
    pub const RIGHTCTRL: u16 = 97;
    pub const KPSLASH: u16 = 98;
    pub const SYSRQ: u16 = 99;
    pub const RIGHTALT: u16 = 100;
    pub const HOME: u16 = 102;
    pub const UP: u16 = 103;
    pub const PAGEUP: u16 = 104;
    pub const LEFT: u16 = 105;
    pub const RIGHT: u16 = 106;
    pub const END: u16 = 107;
    pub const DOWN: u16 = 108;
    pub const PAGEDOWN: u16 = 109;
    pub const INSERT: u16 = 110;
    pub const DELETE: u16 = 111;
    pub const PAUSE: u16 = 119;
    pub const LEFTMETA: u16 = 125;
    pub const RIGHTMETA: u16 = 126;
    pub const COMPOSE: u16 = 127;
}

/// Letter keys in alphabetical order (a..z).
const LETTERS: [u16; 26] = [
    key::A,
    key::B,
    key::C,
    key::D,
    key::E,
    key::F,
    key::G,
    key::H,
    key::I,
    key::J,
    key::K,
    key::L,
    key::M,
    key::N,
    key::O,
    key::P,
    key::Q,
    key::R,
    key::S,
    key::T,
    key::U,
    key::V,
    key::W,
    key::X,
    key::Y,
    key::Z,
];

/// Digit keys in order (0..9).
const DIGITS: [u16; 10] = [
    key::N0,
    key::N1,
    key::N2,
    key::N3,
    key::N4,
    key::N5,
    key::N6,
    key::N7,
    key::N8,
    key::N9,
];

/// The key and shift state producing a printable ASCII character on a US
/// keyboard.
fn ascii(c: u8) -> Option<(u16, bool)> {
    Some(match c {
        b'a'..=b'z' => (LETTERS[usize::from(c - b'a')], false),
        b'A'..=b'Z' => (LETTERS[usize::from(c - b'A')], true),
        b'0'..=b'9' => (DIGITS[usize::from(c - b'0')], false),
        b' ' => (key::SPACE, false),
        b'!' => (key::N1, true),
        b'@' => (key::N2, true),
        b'#' => (key::N3, true),
        b'$' => (key::N4, true),
        b'%' => (key::N5, true),
        b'^' => (key::N6, true),
        b'&' => (key::N7, true),
        b'*' => (key::N8, true),
        b'(' => (key::N9, true),
        b')' => (key::N0, true),
        b'-' => (key::MINUS, false),
        b'_' => (key::MINUS, true),
        b'=' => (key::EQUAL, false),
        b'+' => (key::EQUAL, true),
        b'[' => (key::LEFTBRACE, false),
        b'{' => (key::LEFTBRACE, true),
        b']' => (key::RIGHTBRACE, false),
        b'}' => (key::RIGHTBRACE, true),
        b'\\' => (key::BACKSLASH, false),
        b'|' => (key::BACKSLASH, true),
        b';' => (key::SEMICOLON, false),
        b':' => (key::SEMICOLON, true),
        b'\'' => (key::APOSTROPHE, false),
        b'"' => (key::APOSTROPHE, true),
        b'`' => (key::GRAVE, false),
        b'~' => (key::GRAVE, true),
        b',' => (key::COMMA, false),
        b'<' => (key::COMMA, true),
        b'.' => (key::DOT, false),
        b'>' => (key::DOT, true),
        b'/' => (key::SLASH, false),
        b'?' => (key::SLASH, true),
        _ => return None,
    })
}

/// Function, editing, modifier and keypad keysyms (X11 keysymdef.h, the
/// 0xfe00 and 0xff00 pages).
fn special(keysym: u32) -> Option<(u16, bool)> {
    let code = match keysym {
        0xff08 => key::BACKSPACE,
        0xff09 => key::TAB,
        // ISO_Left_Tab is what X sends for shift+Tab.
        0xfe20 => return Some((key::TAB, true)),
        0xff0d => key::ENTER,
        0xff13 => key::PAUSE,
        0xff14 => key::SCROLLLOCK,
        0xff15 => key::SYSRQ,
        0xff1b => key::ESC,
        0xff50 => key::HOME,
        0xff51 => key::LEFT,
        0xff52 => key::UP,
        0xff53 => key::RIGHT,
        0xff54 => key::DOWN,
        0xff55 => key::PAGEUP,
        0xff56 => key::PAGEDOWN,
        0xff57 => key::END,
        0xff61 => key::SYSRQ,
        0xff63 => key::INSERT,
        0xff67 => key::COMPOSE,
        0xff7f => key::NUMLOCK,
        0xff8d => key::KPENTER,
        0xffaa => key::KPASTERISK,
        0xffab => key::KPPLUS,
        0xffad => key::KPMINUS,
        0xffae => key::KPDOT,
        0xffaf => key::KPSLASH,
        0xffb0 => key::KP0,
        0xffb1 => key::KP1,
        0xffb2 => key::KP2,
        0xffb3 => key::KP3,
        0xffb4 => key::KP4,
        0xffb5 => key::KP5,
        0xffb6 => key::KP6,
        0xffb7 => key::KP7,
        0xffb8 => key::KP8,
        0xffb9 => key::KP9,
        0xffbe => key::F1,
        0xffbf => key::F2,
        0xffc0 => key::F3,
        0xffc1 => key::F4,
        0xffc2 => key::F5,
        0xffc3 => key::F6,
        0xffc4 => key::F7,
        0xffc5 => key::F8,
        0xffc6 => key::F9,
        0xffc7 => key::F10,
        0xffc8 => key::F11,
        0xffc9 => key::F12,
        0xffe1 => key::LEFTSHIFT,
        0xffe2 => key::RIGHTSHIFT,
        0xffe3 => key::LEFTCTRL,
        0xffe4 => key::RIGHTCTRL,
        0xffe5 => key::CAPSLOCK,
        0xffe7 => key::LEFTMETA,
        0xffe8 => key::RIGHTMETA,
        0xffe9 => key::LEFTALT,
        0xffea => key::RIGHTALT,
        0xffeb => key::LEFTMETA,
        0xffec => key::RIGHTMETA,
        // ISO_Level3_Shift: AltGr, the right Alt key.
        0xfe03 => key::RIGHTALT,
        0xffff => key::DELETE,
        _ => return None,
    };
    Some((code, false))
}

/// The Linux key code for an X11 keysym and whether a US layout needs
/// shift held to produce it; `None` for keysyms with no US key.
pub fn keysym_to_evdev(keysym: u32) -> Option<(u16, bool)> {
    match keysym {
        // Latin-1 keysyms equal their character code.
        0x20..=0x7e => ascii(keysym as u8),
        _ => special(keysym),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_digits_and_punctuation() {
        assert_eq!(keysym_to_evdev(u32::from(b'a')), Some((30, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'A')), Some((30, true)));
        assert_eq!(keysym_to_evdev(u32::from(b'q')), Some((16, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'Z')), Some((44, true)));
        assert_eq!(keysym_to_evdev(u32::from(b'm')), Some((50, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'1')), Some((2, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'0')), Some((11, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'!')), Some((2, true)));
        assert_eq!(keysym_to_evdev(u32::from(b')')), Some((11, true)));
        assert_eq!(keysym_to_evdev(u32::from(b' ')), Some((57, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'/')), Some((53, false)));
        assert_eq!(keysym_to_evdev(u32::from(b'?')), Some((53, true)));
        assert_eq!(keysym_to_evdev(u32::from(b'~')), Some((41, true)));
        assert_eq!(keysym_to_evdev(u32::from(b'"')), Some((40, true)));
    }

    #[test]
    fn every_printable_ascii_maps() {
        for c in 0x20u32..=0x7e {
            assert!(keysym_to_evdev(c).is_some(), "keysym {c:#x}");
        }
        assert_eq!(keysym_to_evdev(0x7f), None);
        assert_eq!(keysym_to_evdev(0x1f), None);
    }

    #[test]
    fn special_keys() {
        assert_eq!(keysym_to_evdev(0xff0d), Some((28, false))); // Return
        assert_eq!(keysym_to_evdev(0xff08), Some((14, false))); // BackSpace
        assert_eq!(keysym_to_evdev(0xff09), Some((15, false))); // Tab
        assert_eq!(keysym_to_evdev(0xff1b), Some((1, false))); // Escape
        assert_eq!(keysym_to_evdev(0xffff), Some((111, false))); // Delete
        assert_eq!(keysym_to_evdev(0xff63), Some((110, false))); // Insert
        assert_eq!(keysym_to_evdev(0xff50), Some((102, false))); // Home
        assert_eq!(keysym_to_evdev(0xff57), Some((107, false))); // End
        assert_eq!(keysym_to_evdev(0xff55), Some((104, false))); // Page_Up
        assert_eq!(keysym_to_evdev(0xff56), Some((109, false))); // Page_Down
        assert_eq!(keysym_to_evdev(0xff51), Some((105, false))); // Left
        assert_eq!(keysym_to_evdev(0xff52), Some((103, false))); // Up
        assert_eq!(keysym_to_evdev(0xff53), Some((106, false))); // Right
        assert_eq!(keysym_to_evdev(0xff54), Some((108, false))); // Down
        assert_eq!(keysym_to_evdev(0xffbe), Some((59, false))); // F1
        assert_eq!(keysym_to_evdev(0xffc7), Some((68, false))); // F10
        assert_eq!(keysym_to_evdev(0xffc8), Some((87, false))); // F11
        assert_eq!(keysym_to_evdev(0xffc9), Some((88, false))); // F12
        assert_eq!(keysym_to_evdev(0xffe1), Some((42, false))); // Shift_L
        assert_eq!(keysym_to_evdev(0xffe2), Some((54, false))); // Shift_R
        assert_eq!(keysym_to_evdev(0xffe3), Some((29, false))); // Control_L
        assert_eq!(keysym_to_evdev(0xffe4), Some((97, false))); // Control_R
        assert_eq!(keysym_to_evdev(0xffe9), Some((56, false))); // Alt_L
        assert_eq!(keysym_to_evdev(0xffea), Some((100, false))); // Alt_R
        assert_eq!(keysym_to_evdev(0xffe7), Some((125, false))); // Meta_L
        assert_eq!(keysym_to_evdev(0xffec), Some((126, false))); // Super_R
        assert_eq!(keysym_to_evdev(0xffe5), Some((58, false))); // Caps_Lock
        assert_eq!(keysym_to_evdev(0xfe20), Some((15, true))); // ISO_Left_Tab
        assert_eq!(keysym_to_evdev(0x1008_ff11), None); // XF86AudioLowerVolume
    }
}

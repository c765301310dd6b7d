//! The serial console on the user's terminal: the guest's COM1 output goes
//! to stdout, keystrokes go to COM1's receive FIFO.
//!
//! When stdin is a terminal it is put in raw mode (every key, Ctrl-C
//! included, goes to the guest) and restored when hakoniwa ends. The
//! escape key is Ctrl-A: `Ctrl-A x` quits, `Ctrl-A Ctrl-A` sends a
//! literal Ctrl-A, `Ctrl-A h` prints help.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use devices::legacy::Serial;
use vmm_sys_util::eventfd::EventFd;

use crate::event::{EventSender, VmmEvent};

/// Ctrl-A.
pub const ESCAPE_BYTE: u8 = 0x01;

/// What one keystroke means after escape processing.
#[derive(Debug, PartialEq, Eq)]
pub enum Key {
    /// Bytes to pass to the guest.
    Guest(Vec<u8>),
    /// The user asked to quit.
    Quit,
    /// The user asked for help.
    Help,
}

/// Splits raw input into guest bytes and escape commands. The state (a
/// pending Ctrl-A) survives between reads, because a key sequence can be
/// split across them.
#[derive(Default)]
pub struct EscapeParser {
    pending_escape: bool,
}

impl EscapeParser {
    pub fn feed(&mut self, input: &[u8]) -> Vec<Key> {
        let mut keys = Vec::new();
        let mut guest = Vec::new();
        for &byte in input {
            if self.pending_escape {
                self.pending_escape = false;
                match byte {
                    b'x' | b'X' => {
                        flush(&mut guest, &mut keys);
                        keys.push(Key::Quit);
                    }
                    b'h' | b'H' | b'?' => {
                        flush(&mut guest, &mut keys);
                        keys.push(Key::Help);
                    }
                    ESCAPE_BYTE => guest.push(ESCAPE_BYTE),
                    other => guest.extend_from_slice(&[ESCAPE_BYTE, other]),
                }
            } else if byte == ESCAPE_BYTE {
                self.pending_escape = true;
            } else {
                guest.push(byte);
            }
        }
        flush(&mut guest, &mut keys);
        keys
    }
}

fn flush(guest: &mut Vec<u8>, keys: &mut Vec<Key>) {
    if !guest.is_empty() {
        keys.push(Key::Guest(std::mem::take(guest)));
    }
}

const HELP: &str =
    "\r\nhakoniwa console: Ctrl-A x  quit | Ctrl-A Ctrl-A  send Ctrl-A | Ctrl-A h  this help\r\n";

/// The guest's console output, written straight to stdout so prompts
/// without a newline show up at once, and its last bytes kept for failure
/// reports (crate::dump).
pub struct ConsoleOutput {
    pub tail: ConsoleTail,
}

impl Write for ConsoleOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tail.push(buf);
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        out.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

/// Writes `text` and `\r\n` (a line that also ends right in a raw-mode
/// terminal) to stderr in one write. `eprint!` writes each piece of its
/// format separately, so another thread's output could land inside the
/// line, and whoever watches stderr (a test, a harness) could read half of
/// it and decide on that.
pub fn say_line(text: &str) {
    let mut line = String::with_capacity(text.len() + 2);
    line.push_str(text);
    line.push_str("\r\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The last [`ConsoleTail::KEPT`] bytes the guest wrote to its console.
#[derive(Clone, Default)]
pub struct ConsoleTail(Arc<Mutex<std::collections::VecDeque<u8>>>);

impl ConsoleTail {
    pub const KEPT: usize = 16 << 10;

    fn push(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = &bytes[bytes.len().saturating_sub(Self::KEPT)..];
        let excess = (tail.len() + bytes.len()).saturating_sub(Self::KEPT);
        tail.drain(..excess);
        tail.extend(bytes);
    }

    /// What was kept, as text.
    pub fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>()).into_owned()
    }
}

/// Puts the terminal on stdin in raw mode and restores it when dropped.
pub struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// Raw mode if stdin is a terminal; None otherwise.
    pub fn enable() -> Option<RawTerminal> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            return None;
        }
        // SAFETY: termios is plain old data; tcgetattr fills it in.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `saved` is a valid termios for tcgetattr to write.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Keep output processing: the guest sends "\r\n" itself, and our
        // own messages on stderr use "\n".
        raw.c_oflag = saved.c_oflag;
        // SAFETY: `raw` is a valid termios derived from the current one.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the attributes saved from this same descriptor.
        unsafe { libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, &self.saved) };
    }
}

/// Starts the thread that feeds stdin to the serial port. It ends at EOF;
/// it is never joined, because it may sit in a blocking read when the VM
/// ends, and the process exit reaps it.
pub fn spawn_input_thread(
    serial: Arc<Mutex<Serial>>,
    input_space: EventFd,
    events: EventSender,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            sandbox::enter_or_exit(sandbox::ThreadKind::ConsoleInput);
            let mut parser = EscapeParser::default();
            let mut stdin = std::io::stdin();
            let mut buf = [0u8; 256];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                };
                for key in parser.feed(&buf[..n]) {
                    match key {
                        Key::Guest(bytes) => feed_guest(&serial, &input_space, &bytes),
                        Key::Quit => {
                            events.send(VmmEvent::UserQuit);
                            return;
                        }
                        Key::Help => eprint!("{HELP}"),
                    }
                }
            }
        })?;
    Ok(())
}

/// Pushes bytes into the FIFO, waiting for the guest to drain it when full.
fn feed_guest(serial: &Mutex<Serial>, input_space: &EventFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let taken = serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .enqueue_input(bytes);
        bytes = &bytes[taken..];
        if !bytes.is_empty() && input_space.read().is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_tail_keeps_the_last_bytes() {
        let tail = ConsoleTail::default();
        tail.push(b"hello ");
        tail.push(b"world");
        assert_eq!(tail.text(), "hello world");
        tail.push(&vec![b'x'; ConsoleTail::KEPT]);
        tail.push(b"!");
        let text = tail.text();
        assert_eq!(text.len(), ConsoleTail::KEPT);
        assert!(text.ends_with("x!") && !text.contains('w'));
    }

    #[test]
    fn plain_bytes_pass_through() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"ls\r"), vec![Key::Guest(b"ls\r".to_vec())]);
    }

    #[test]
    fn ctrl_a_x_quits_even_across_reads() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"ab\x01"), vec![Key::Guest(b"ab".to_vec())]);
        assert_eq!(p.feed(b"x"), vec![Key::Quit]);
    }

    #[test]
    fn double_ctrl_a_sends_one() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"\x01\x01z"), vec![Key::Guest(b"\x01z".to_vec())]);
    }

    #[test]
    fn unknown_escape_sends_both_bytes_and_help_is_recognised() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"\x01q"), vec![Key::Guest(b"\x01q".to_vec())]);
        assert_eq!(
            p.feed(b"a\x01hb"),
            vec![
                Key::Guest(b"a".to_vec()),
                Key::Help,
                Key::Guest(b"b".to_vec())
            ]
        );
    }

    #[test]
    fn ctrl_c_goes_to_the_guest() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"\x03"), vec![Key::Guest(vec![3])]);
    }
}

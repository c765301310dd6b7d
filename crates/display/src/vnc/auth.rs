//! VNC Authentication (RFC 6143 7.2.2): DES challenge-response.
//!
//! The server sends 16 random bytes; the client encrypts them with DES in
//! ECB mode (two independent 8-byte blocks) keyed by the password. The key
//! is the password's first 8 bytes, zero-padded, with the bits of each
//! byte reversed: the original implementation fed DES its key LSB-first,
//! and every client since does the same.

use des::cipher::generic_array::GenericArray;
use des::cipher::{BlockEncrypt, KeyInit};
use des::Des;

/// Length of the challenge and of the response.
pub const CHALLENGE_LEN: usize = 16;

/// The DES key VNC derives from a password.
pub fn vnc_key(password: &str) -> [u8; 8] {
    let mut key = [0u8; 8];
    for (k, b) in key.iter_mut().zip(password.as_bytes()) {
        *k = b.reverse_bits();
    }
    key
}

/// What a client holding `password` answers to `challenge`.
pub fn response(password: &str, challenge: &[u8; CHALLENGE_LEN]) -> [u8; CHALLENGE_LEN] {
    let cipher = Des::new(GenericArray::from_slice(&vnc_key(password)));
    let mut out = *challenge;
    for block in out.chunks_exact_mut(8) {
        cipher.encrypt_block(GenericArray::from_mut_slice(block));
    }
    out
}

/// Whether `answer` is the right response. Compared without an early exit
/// so the time taken does not tell an attacker how many bytes matched.
pub fn verify(password: &str, challenge: &[u8; CHALLENGE_LEN], answer: &[u8]) -> bool {
    let want = response(password, challenge);
    answer.len() == CHALLENGE_LEN
        && want
            .iter()
            .zip(answer)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// A fresh challenge from the kernel's random pool: a predictable one
/// would let a recorded response be replayed. getrandom(2), not
/// /dev/urandom: a client's thread may not open files (docs/security.md).
pub fn new_challenge() -> std::io::Result<[u8; CHALLENGE_LEN]> {
    let mut c = [0u8; CHALLENGE_LEN];
    let mut filled = 0;
    while filled < c.len() {
        let rest = &mut c[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes
        // that getrandom writes at most `rest.len()` bytes into.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(err);
        }
        filled += n as usize;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn des_known_answer() {
        // The classic worked DES example (key 133457799BBCDFF1).
        let cipher = Des::new(GenericArray::from_slice(&hex("133457799bbcdff1")));
        let mut block = hex("0123456789abcdef");
        cipher.encrypt_block(GenericArray::from_mut_slice(&mut block));
        assert_eq!(block, hex("85e813540f0ab405"));
    }

    #[test]
    fn vnc_known_answers() {
        // Computed independently with `openssl enc -des-ecb -nopad` and
        // the bit-reversed keys 0e86ceceeef64e26 / cea6c64ea62e0000.
        assert_eq!(vnc_key("password").to_vec(), hex("0e86ceceeef64e26"));
        let challenge: [u8; 16] = std::array::from_fn(|i| i as u8);
        let want = hex("b866924125c8eebb9debc1db61c538e2");
        assert_eq!(response("password", &challenge).to_vec(), want);
        // Only the first 8 bytes count.
        assert_eq!(response("password-and-more", &challenge).to_vec(), want);
        assert!(verify("password", &challenge, &want));
        assert!(!verify("passwore", &challenge, &want));
        assert!(!verify("password", &challenge, &want[..15]));

        let challenge: [u8; 16] = std::array::from_fn(|i| 0xf0 + i as u8);
        assert_eq!(
            response("secret", &challenge).to_vec(),
            hex("1ec699b6546bd29e1e1fbc5bf298c9ca")
        );
    }

    #[test]
    fn challenges_differ() {
        assert_ne!(new_challenge().unwrap(), new_challenge().unwrap());
    }
}

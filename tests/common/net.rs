//! Host-side network plumbing for guest tests: TAPs, a bridge, md5 of
//! what went over them. Needs root (the rig runs tests as root).

/// Runs `ip ARGS`, asserting it worked.
pub fn ip(args: &[&str]) {
    let status = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("cannot run ip");
    assert!(status.success(), "ip {args:?} failed");
}

/// md5 of `data` as hex, from the host's md5sum.
pub fn md5_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Network devices made for a test, removed (in reverse) when dropped.
pub struct HostLinks {
    names: Vec<String>,
}

impl HostLinks {
    /// A TAP with `host_ip`/24 on the host side.
    pub fn tap(name: &str, host_ip: &str) -> HostLinks {
        ip(&["tuntap", "add", "dev", name, "mode", "tap"]);
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", name]);
        ip(&["link", "set", name, "up"]);
        HostLinks {
            names: vec![name.to_string()],
        }
    }

    /// A (learning) bridge with `host_ip`/24 and one TAP per VMM in it.
    /// Two hakoniwa processes cannot hold one TAP, so a migration's source
    /// and destination each get theirs; the bridge learns which one the
    /// guest is behind from the destination's announcement (a RARP from the
    /// guest's MAC when its virtio-net device is restored).
    pub fn bridge(name: &str, host_ip: &str, taps: &[&str]) -> HostLinks {
        ip(&["link", "add", name, "type", "bridge"]);
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", name]);
        ip(&["link", "set", name, "up"]);
        let mut names = vec![name.to_string()];
        for tap in taps {
            ip(&["tuntap", "add", "dev", tap, "mode", "tap"]);
            names.push(tap.to_string());
            ip(&["link", "set", tap, "master", name]);
            ip(&["link", "set", tap, "up"]);
        }
        HostLinks { names }
    }

    /// The first link's name (the TAP, or the bridge).
    pub fn name(&self) -> &str {
        &self.names[0]
    }
}

impl Drop for HostLinks {
    fn drop(&mut self) {
        for name in self.names.iter().rev() {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", name])
                .status();
        }
    }
}

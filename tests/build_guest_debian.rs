//! `scripts/build-guest-debian` without building anything (no network, no
//! KVM): its usage, and the mirror it takes from apt's sources, one-line and
//! deb822, through `--dry-run` with `HK_APT_ETC` pointing at sources written
//! here. The hosts below are `.invalid` (RFC 2606): nothing is contacted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::project_root;

fn script(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(project_root().join("scripts/build-guest-debian"));
    command.args(args).env_remove("HK_DEBIAN_MIRROR");
    for (name, value) in env {
        command.env(name, value);
    }
    command
        .output()
        .expect("cannot run scripts/build-guest-debian")
}

/// A fresh /etc/apt look-alike: FILES are (path under it, content).
fn apt_etc(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hakoniwa-debian-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sources.list.d")).unwrap();
    for (path, content) in files {
        std::fs::write(dir.join(path), content).unwrap();
    }
    dir
}

/// The "mirror: ..." line of a dry run with these apt sources.
fn dry_run_mirror(etc: &Path) -> String {
    let out = script(&["--dry-run"], &[("HK_APT_ETC", etc)]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("suite: bookworm\n"), "{stdout}");
    for package in ["systemd", "fio", "postmark", "stress", "iperf3", "apache2"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("packages:") && l.split(' ').any(|w| w == package)),
            "{package} missing: {stdout}"
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("mirror: "))
        .unwrap_or_else(|| panic!("no mirror line: {stdout}"))
        .to_string()
}

#[test]
fn help_prints_the_usage_and_bad_flags_exit_2() {
    let out = script(&["--help"], &[]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("scripts/build-guest-debian [--force | --dry-run | --help]"),
        "{stdout}"
    );
    let out = script(&["--bogus"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_mirror_comes_from_the_first_matching_deb_source() {
    let etc = apt_etc(
        "mixed",
        &[
            (
                "sources.list",
                "# deb http://commented.invalid/debian bookworm main\n\
                 deb-src http://source.invalid/debian bookworm main\n\
                 deb [arch=amd64 signed-by=/k.gpg] http://backports.invalid/debian bookworm-backports main\n\
                 deb http://contrib-only.invalid/debian bookworm contrib\n",
            ),
            (
                "sources.list.d/a.sources",
                "Types: deb\nURIs: http://disabled.invalid/debian\nSuites: bookworm\n\
                 Components: main\nEnabled: no\n\n\
                 # a comment\n\
                 Types: deb-src deb\n\
                 URIs: http://mirror.invalid/debian/ http://second.invalid/debian\n\
                 Suites: bookworm bookworm-updates\n\
                 Components: main contrib\n\
                 Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n Suites: trixie\n .\n",
            ),
            (
                "sources.list.d/z.list",
                "deb http://later.invalid/debian bookworm main\n",
            ),
            (
                "sources.list.d/ignored.list.disabled",
                "deb http://ignored.invalid/debian bookworm main\n",
            ),
        ],
    );
    assert_eq!(dry_run_mirror(&etc), "http://mirror.invalid/debian");

    // The one-line format, when it comes first.
    let etc = apt_etc(
        "one-line",
        &[(
            "sources.list",
            "deb [ signed-by=/k.gpg ] https://one-line.invalid/debian bookworm main non-free\n",
        )],
    );
    assert_eq!(dry_run_mirror(&etc), "https://one-line.invalid/debian");
}

#[test]
fn hk_debian_mirror_overrides_and_no_source_is_one_error() {
    let etc = apt_etc(
        "none",
        &[("sources.list", "deb http://x.invalid/debian trixie main\n")],
    );
    let out = Command::new(project_root().join("scripts/build-guest-debian"))
        .arg("--dry-run")
        .env("HK_APT_ETC", &etc)
        .env("HK_DEBIAN_MIRROR", "http://override.invalid/debian/")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("mirror: http://override.invalid/debian\n"),
        "{stdout}"
    );

    let out = script(&["--dry-run"], &[("HK_APT_ETC", &etc)]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no 'deb' source for bookworm main") && stderr.lines().count() == 1,
        "{stderr}"
    );
}

//! The tracer's client of the guest I/O agent (`guest/tools/hk-ioagent.c`,
//! docs/iotrace.md, "The guest agent"): the application layer's counters,
//! the guest's memory, and which disk blocks its page cache holds.
//!
//! The wire format, all of it here (the agent's C defines repeat it):
//! the VMM connects to the VM's `--vsock uds=PATH` socket, writes
//! `CONNECT 5002\n` and reads `OK <port>\n` (the hybrid vsock handshake,
//! docs/devices.md); then it writes one request line
//!
//! ```text
//! report [pid=P]... [comm=NAME]... [dev=/dev/vdX]...
//! ```
//!
//! and reads one JSON object line ([`AgentAnswer`], or `{"error":".."}`)
//! until the agent closes the connection, within [`AGENT_TIMEOUT`].

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The agent's vsock port.
pub const AGENT_PORT: u32 = 5002;
/// The `agent` field of an answer this client understands.
pub const AGENT_NAME: &str = "hk-ioagent 1";
/// How long a whole exchange may take. A guest busy with the traced
/// workload, sharing one CPU with other guests, took over 2 s to answer
/// in the benchmark (bench-iocache's first run), so 10.
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest answer read (the agent's own bound, plus its newline).
const MAX_ANSWER: u64 = 16 << 20;
/// A process name as the guest kernel keeps it (`comm`): at most 15 bytes.
const MAX_COMM: usize = 15;

/// What to ask the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentQuery {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    /// Guest block devices whose cache residency to report.
    pub devices: Vec<String>,
}

impl AgentQuery {
    /// This query's processes alone (the answer also has the meminfo).
    pub fn processes(&self) -> AgentQuery {
        AgentQuery {
            devices: Vec::new(),
            ..self.clone()
        }
    }

    /// This query's devices alone.
    pub fn devices(&self) -> AgentQuery {
        AgentQuery {
            devices: self.devices.clone(),
            ..AgentQuery::default()
        }
    }

    /// The request line, newline included; one-line refusal of a name the
    /// grammar cannot carry.
    pub fn request_line(&self) -> Result<String, AgentError> {
        let mut line = String::from("report");
        for pid in &self.pids {
            if *pid == 0 || *pid > i32::MAX as u32 {
                return Err(AgentError::BadQuery(format!(
                    "pid {pid} is not a process id"
                )));
            }
            line += &format!(" pid={pid}");
        }
        for comm in &self.comms {
            if comm.is_empty() || comm.len() > MAX_COMM || !is_word(comm) {
                return Err(AgentError::BadQuery(format!(
                    "process name {comm:?} must be 1 to {MAX_COMM} bytes without spaces"
                )));
            }
            line += &format!(" comm={comm}");
        }
        for dev in &self.devices {
            if !dev.starts_with("/dev/") || dev.len() > 200 || !is_word(dev) {
                return Err(AgentError::BadQuery(format!(
                    "guest device {dev:?} must be a /dev/ path without spaces"
                )));
            }
            line += &format!(" dev={dev}");
        }
        line.push('\n');
        Ok(line)
    }
}

fn is_word(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

/// Why the agent gave no answer. One line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    #[error("no guest agent: the VM has no vsock device (run it with --vsock cid=N,uds=PATH)")]
    NoVsock,
    #[error("the guest agent: cannot connect to the vsock socket {path}: {reason}")]
    Connect { path: String, reason: String },
    #[error("the guest agent does not answer on vsock port {AGENT_PORT} (is hk-ioagent running in the guest?)")]
    NotListening,
    #[error("the guest agent did not answer in time ({} s)", AGENT_TIMEOUT.as_secs())]
    Timeout,
    #[error("the guest agent: {0}")]
    Io(String),
    #[error("malformed answer from the guest agent: {0}")]
    Malformed(String),
    #[error("the guest agent refused the request: {0}")]
    Refused(String),
    #[error("{0}")]
    BadQuery(String),
}

/// `/proc/meminfo` of the guest, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meminfo {
    pub mem_total_kib: u64,
    pub mem_available_kib: u64,
    pub cached_kib: u64,
    pub swap_total_kib: u64,
    pub swap_free_kib: u64,
}

/// One process's `/proc/PID/io` and open files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessIo {
    pub pid: u32,
    pub comm: String,
    pub rchar: u64,
    pub wchar: u64,
    pub syscr: u64,
    pub syscw: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub direct_fds: u64,
    pub buffered_fds: u64,
}

/// A process the agent reported, or why it could not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProcessEntry {
    Io(ProcessIo),
    Missing { pid: u32, error: String },
}

/// The guest page cache's residency of one disk, in the agent's pages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceResidency {
    pub path: String,
    pub size: u64,
    pub page_bytes: u64,
    pub resident_pages: u64,
    /// `[first_page, count]` runs.
    pub resident: Vec<(u64, u64)>,
}

impl DeviceResidency {
    /// The resident runs as 4 KiB-block ranges of the disk (`block_bytes`
    /// a multiple or divisor of the agent's page), checked against the
    /// disk's size and the page count the agent gave.
    pub fn blocks(&self, block_bytes: u64) -> Result<Vec<(u64, u64)>, AgentError> {
        let bad = |why: String| AgentError::Malformed(format!("device {}: {why}", self.path));
        if self.page_bytes == 0 || block_bytes == 0 {
            return Err(bad("page_bytes is 0".into()));
        }
        let pages = self.size.div_ceil(self.page_bytes);
        let mut counted = 0u64;
        let mut out = Vec::with_capacity(self.resident.len());
        for &(first, count) in &self.resident {
            let end = first
                .checked_add(count)
                .filter(|&end| end <= pages && count > 0)
                .ok_or_else(|| bad(format!("run [{first},{count}] is beyond its {pages} pages")))?;
            counted += count;
            let start_byte = first * self.page_bytes;
            let end_byte = end * self.page_bytes;
            out.push((
                start_byte / block_bytes,
                end_byte.div_ceil(block_bytes) - start_byte / block_bytes,
            ));
        }
        if counted != self.resident_pages {
            return Err(bad(format!(
                "its runs hold {counted} pages, not resident_pages {}",
                self.resident_pages
            )));
        }
        Ok(out)
    }
}

/// A device the agent reported, or why it could not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceEntry {
    Residency(DeviceResidency),
    Failed { path: String, error: String },
}

/// The agent's answer to a `report` request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentAnswer {
    pub agent: String,
    pub meminfo: Meminfo,
    pub processes: Vec<ProcessEntry>,
    pub devices: Vec<DeviceEntry>,
}

impl AgentAnswer {
    /// The answer in `text` (one JSON line): the agent's refusal, or a
    /// malformed answer, as one-line errors.
    pub fn parse(text: &str) -> Result<AgentAnswer, AgentError> {
        let value: serde_json::Value = serde_json::from_str(text.trim_end())
            .map_err(|e| AgentError::Malformed(e.to_string()))?;
        if let Some(error) = value.get("error") {
            return Err(AgentError::Refused(
                error
                    .as_str()
                    .unwrap_or("(not a string)")
                    .replace('\n', " "),
            ));
        }
        let answer: AgentAnswer = serde_json::from_value(value)
            .map_err(|e| AgentError::Malformed(e.to_string().replace('\n', " ")))?;
        if answer.agent != AGENT_NAME {
            return Err(AgentError::Malformed(format!(
                "agent {:?}, not {AGENT_NAME:?}",
                answer.agent
            )));
        }
        Ok(answer)
    }

    /// The entry of device `path`.
    pub fn device(&self, path: &str) -> Option<&DeviceEntry> {
        self.devices.iter().find(|d| match d {
            DeviceEntry::Residency(r) => r.path == path,
            DeviceEntry::Failed { path: p, .. } => p == path,
        })
    }
}

/// Asks the agent of the VM whose vsock socket is `uds`.
pub fn ask(uds: &Path, query: &AgentQuery) -> Result<AgentAnswer, AgentError> {
    ask_within(uds, query, AGENT_TIMEOUT)
}

/// [`ask`] with a deadline of `timeout` for the whole exchange.
fn ask_within(
    uds: &Path,
    query: &AgentQuery,
    timeout: Duration,
) -> Result<AgentAnswer, AgentError> {
    let line = query.request_line()?;
    let deadline = Instant::now() + timeout;
    let mut stream = UnixStream::connect(uds).map_err(|e| AgentError::Connect {
        path: uds.display().to_string(),
        reason: api::io_reason(&e),
    })?;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => AgentError::Timeout,
        _ => AgentError::Io(api::io_reason(&e)),
    };
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream
        .write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
        .map_err(io)?;
    // The handshake's answer, a byte at a time: the agent's bytes follow
    // on the same stream.
    let mut ok = Vec::new();
    loop {
        let left = remaining(deadline)?;
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let mut byte = [0u8];
        match stream.read(&mut byte) {
            Ok(0) => return Err(AgentError::NotListening),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if ok.len() < 64 => ok.push(byte[0]),
            Ok(_) => {
                return Err(AgentError::Malformed(
                    "vsock handshake line too long".into(),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(AgentError::NotListening)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if !ok.starts_with(b"OK ") {
        return Err(AgentError::NotListening);
    }
    stream.write_all(line.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    let mut limited = (&stream).take(MAX_ANSWER + 1);
    let mut chunk = [0u8; 65536];
    loop {
        let left = remaining(deadline)?;
        stream.set_read_timeout(Some(left)).map_err(io)?;
        match limited.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if answer.len() as u64 > MAX_ANSWER {
        return Err(AgentError::Malformed(format!(
            "the answer is over {MAX_ANSWER} bytes"
        )));
    }
    if answer.is_empty() {
        return Err(AgentError::NotListening);
    }
    let text = std::str::from_utf8(&answer)
        .map_err(|_| AgentError::Malformed("the answer is not UTF-8".into()))?;
    AgentAnswer::parse(text)
}

fn remaining(deadline: Instant) -> Result<Duration, AgentError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(AgentError::Timeout)
}

/// The name Linux's virtio-blk gives its `index`th disk (0: vda, 25: vdz,
/// 26: vdaa), as `virtblk_name_format` does.
pub fn virtio_blk_name(index: usize) -> String {
    let mut letters = Vec::new();
    let mut i = index + 1;
    while i > 0 {
        i -= 1;
        letters.push(b'a' + (i % 26) as u8);
        i /= 26;
    }
    letters.reverse();
    format!("/dev/vd{}", String::from_utf8_lossy(&letters))
}

/// The application layer's counters between two answers, per process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDelta {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub comm: String,
    /// `rchar` and `wchar`: bytes the process read and wrote through
    /// system calls (files, pipes, sockets alike).
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// `syscr` and `syscw`: its read and write calls.
    pub reads: u64,
    pub writes: u64,
    /// `read_bytes` and `write_bytes`: what it made the block layer read
    /// and (at writeback) write, per the guest kernel.
    pub storage_read_bytes: u64,
    pub storage_write_bytes: u64,
    /// Open regular files with O_DIRECT, and without, at the later answer.
    pub direct_fds: u64,
    pub buffered_fds: u64,
    /// Why the process is not counted (gone, unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Each process of `now` against `start`: its counters' growth since the
/// start (the same pid with the same comm), or all of them for a process
/// that started in the window; processes of `start` missing from `now`
/// (a named pid that exited) are listed with their error.
pub fn deltas(start: &[ProcessEntry], now: &[ProcessEntry]) -> Vec<ProcessDelta> {
    let before = |pid: u32, comm: &str| {
        start.iter().find_map(|e| match e {
            ProcessEntry::Io(p) if p.pid == pid && p.comm == comm => Some(p),
            _ => None,
        })
    };
    let mut out = Vec::new();
    for entry in now {
        match entry {
            ProcessEntry::Io(p) => {
                let zero = ProcessIo::default();
                let b = before(p.pid, &p.comm).unwrap_or(&zero);
                out.push(ProcessDelta {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    read_bytes: p.rchar.saturating_sub(b.rchar),
                    write_bytes: p.wchar.saturating_sub(b.wchar),
                    reads: p.syscr.saturating_sub(b.syscr),
                    writes: p.syscw.saturating_sub(b.syscw),
                    storage_read_bytes: p.read_bytes.saturating_sub(b.read_bytes),
                    storage_write_bytes: p.write_bytes.saturating_sub(b.write_bytes),
                    direct_fds: p.direct_fds,
                    buffered_fds: p.buffered_fds,
                    error: None,
                });
            }
            ProcessEntry::Missing { pid, error } => out.push(ProcessDelta {
                pid: *pid,
                error: Some(error.clone()),
                ..ProcessDelta::default()
            }),
        }
    }
    // Comm-matched processes of the start that are gone now.
    for entry in start {
        if let ProcessEntry::Io(p) = entry {
            if !out.iter().any(|d| d.pid == p.pid) {
                out.push(ProcessDelta {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    error: Some("exited during the window: its I/O is not counted".into()),
                    ..ProcessDelta::default()
                });
            }
        }
    }
    out
}

/// The bytes both caches hold, measured: the guest's resident disk blocks
/// (the agent's runs, [`DeviceResidency::blocks`]) against the image's
/// blocks resident in the host page cache (`mincore`), in `block_bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoubleCachedMeasured {
    /// The guest device the agent measured.
    pub guest_device: String,
    /// The disk's bytes the guest page cache holds.
    pub guest_bytes: u64,
    /// The image's bytes the host page cache holds.
    pub host_bytes: u64,
    /// Bytes held by both.
    pub both_bytes: u64,
}

/// |guest ∩ host| in blocks, the guest given as `(first, count)` runs.
pub fn intersect(guest_runs: &[(u64, u64)], host: &BTreeSet<u64>) -> u64 {
    guest_runs
        .iter()
        .map(|&(first, count)| host.range(first..first.saturating_add(count)).count() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = r#"{"agent":"hk-ioagent 1","meminfo":{"mem_total_kib":500000,"mem_available_kib":400000,"cached_kib":30000,"swap_total_kib":0,"swap_free_kib":0},"processes":[{"pid":7,"comm":"sh","rchar":100,"wchar":10,"syscr":3,"syscw":1,"read_bytes":0,"write_bytes":0,"direct_fds":0,"buffered_fds":1},{"pid":9,"error":"no such process"}],"devices":[{"path":"/dev/vdb","size":65536,"page_bytes":4096,"resident_pages":5,"resident":[[0,2],[10,3]]},{"path":"/dev/vdz","error":"not a block device"}]}"#;

    #[test]
    fn the_request_line_follows_the_grammar_and_refuses_what_it_cannot_carry() {
        let query = AgentQuery {
            pids: vec![7, 9],
            comms: vec!["fio".into()],
            devices: vec!["/dev/vdb".into()],
        };
        assert_eq!(
            query.request_line().unwrap(),
            "report pid=7 pid=9 comm=fio dev=/dev/vdb\n"
        );
        assert_eq!(AgentQuery::default().request_line().unwrap(), "report\n");
        for bad in [
            AgentQuery {
                comms: vec!["two words".into()],
                ..AgentQuery::default()
            },
            AgentQuery {
                comms: vec!["sixteen-bytes-xx".into()],
                ..AgentQuery::default()
            },
            AgentQuery {
                devices: vec!["vdb".into()],
                ..AgentQuery::default()
            },
            AgentQuery {
                pids: vec![0],
                ..AgentQuery::default()
            },
        ] {
            let e = bad.request_line().unwrap_err();
            assert!(matches!(e, AgentError::BadQuery(_)), "{e}");
        }
    }

    #[test]
    fn an_answer_parses_with_a_vanished_process_and_a_failed_device() {
        let answer = AgentAnswer::parse(ANSWER).unwrap();
        assert_eq!(answer.meminfo.cached_kib, 30000);
        assert_eq!(
            answer.processes[1],
            ProcessEntry::Missing {
                pid: 9,
                error: "no such process".into()
            }
        );
        let ProcessEntry::Io(sh) = &answer.processes[0] else {
            panic!("{answer:?}")
        };
        assert_eq!((sh.comm.as_str(), sh.rchar, sh.syscr), ("sh", 100, 3));
        let Some(DeviceEntry::Residency(vdb)) = answer.device("/dev/vdb") else {
            panic!("{answer:?}")
        };
        assert_eq!(vdb.blocks(4096).unwrap(), vec![(0, 2), (10, 3)]);
        // In 8 KiB blocks the runs round outwards.
        assert_eq!(vdb.blocks(8192).unwrap(), vec![(0, 1), (5, 2)]);
        assert!(matches!(
            answer.device("/dev/vdz"),
            Some(DeviceEntry::Failed { .. })
        ));
        assert!(answer.device("/dev/vdc").is_none());
    }

    #[test]
    fn malformed_answers_and_refusals_are_one_line_errors() {
        let cases = [
            ("", "malformed"),
            ("{\"agent\":", "malformed"),
            ("[1,2]", "malformed"),
            // A counter missing from a live process.
            (
                &ANSWER.replace("\"rchar\":100,", ""),
                "malformed answer from the guest agent",
            ),
            (
                &ANSWER.replace("-1", "x").replace(":100,", ":-100,"),
                "malformed",
            ),
            (
                &ANSWER.replace("hk-ioagent 1", "hk-ioagent 2"),
                "not \"hk-ioagent 1\"",
            ),
            (
                "{\"error\":\"unknown word 'x'\"}",
                "refused the request: unknown word 'x'",
            ),
        ];
        for (text, expected) in cases {
            let e = AgentAnswer::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // Runs beyond the disk, or not adding up to resident_pages.
        let answer = AgentAnswer::parse(&ANSWER.replace("[10,3]", "[15,3]")).unwrap();
        let Some(DeviceEntry::Residency(vdb)) = answer.device("/dev/vdb") else {
            panic!()
        };
        assert!(vdb.blocks(4096).unwrap_err().to_string().contains("beyond"));
        let answer = AgentAnswer::parse(&ANSWER.replace("[10,3]", "[10,2]")).unwrap();
        let Some(DeviceEntry::Residency(vdb)) = answer.device("/dev/vdb") else {
            panic!()
        };
        assert!(vdb
            .blocks(4096)
            .unwrap_err()
            .to_string()
            .contains("not resident_pages 5"));
    }

    fn io(pid: u32, comm: &str, rchar: u64, syscr: u64) -> ProcessEntry {
        ProcessEntry::Io(ProcessIo {
            pid,
            comm: comm.into(),
            rchar,
            syscr,
            ..ProcessIo::default()
        })
    }

    #[test]
    fn deltas_count_growth_new_processes_whole_and_name_the_gone() {
        let start = [
            io(7, "sh", 1000, 10),
            io(8, "fio", 50, 5),
            io(11, "fio", 5, 1),
        ];
        let now = [
            io(7, "sh", 1000 + (16 << 20), 10 + 16),
            // pid 11 reused by another program: counted from zero.
            io(11, "dd", 300, 3),
            io(12, "fio", 700, 7),
            ProcessEntry::Missing {
                pid: 9,
                error: "no such process".into(),
            },
        ];
        let d = deltas(&start, &now);
        let by_pid = |pid| d.iter().find(|d| d.pid == pid).unwrap();
        assert_eq!((by_pid(7).read_bytes, by_pid(7).reads), (16 << 20, 16));
        assert_eq!((by_pid(11).read_bytes, by_pid(11).reads), (300, 3));
        assert_eq!((by_pid(12).read_bytes, by_pid(12).reads), (700, 7));
        assert_eq!(by_pid(9).error.as_deref(), Some("no such process"));
        assert!(by_pid(8).error.as_deref().unwrap().contains("exited"));
        assert_eq!(by_pid(8).read_bytes, 0);
        assert_eq!(d.len(), 5);
        // A counter that went down (never, but a pid reused with the same
        // name could) does not wrap.
        let d = deltas(&[io(7, "sh", 500, 5)], &[io(7, "sh", 100, 1)]);
        assert_eq!((d[0].read_bytes, d[0].reads), (0, 0));
    }

    #[test]
    fn the_intersection_counts_blocks_in_both() {
        let host: BTreeSet<u64> = [0, 1, 5, 11, 12, 13, 40].into_iter().collect();
        assert_eq!(intersect(&[(0, 2), (10, 3)], &host), 4);
        assert_eq!(intersect(&[], &host), 0);
        assert_eq!(intersect(&[(100, 10)], &host), 0);
        assert_eq!(intersect(&[(u64::MAX - 1, 5)], &host), 0);
    }

    #[test]
    fn virtio_blk_names_follow_the_kernel() {
        assert_eq!(virtio_blk_name(0), "/dev/vda");
        assert_eq!(virtio_blk_name(1), "/dev/vdb");
        assert_eq!(virtio_blk_name(25), "/dev/vdz");
        assert_eq!(virtio_blk_name(26), "/dev/vdaa");
        assert_eq!(virtio_blk_name(27), "/dev/vdab");
        assert_eq!(virtio_blk_name(701), "/dev/vdzz");
        assert_eq!(virtio_blk_name(702), "/dev/vdaaa");
    }

    /// A fake vsock socket: answers the handshake as `hello` says, then
    /// `answer` after reading the request line (checked).
    fn fake_vsock(
        hello: &'static str,
        answer: &'static str,
        delay: Duration,
    ) -> std::path::PathBuf {
        use std::io::BufRead;
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "hk-ioagent-test-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, format!("CONNECT {AGENT_PORT}\n"));
            let mut w = &stream;
            w.write_all(hello.as_bytes()).unwrap();
            if hello.is_empty() {
                return;
            }
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, "report pid=7 dev=/dev/vdb\n");
            std::thread::sleep(delay);
            let _ = w.write_all(answer.as_bytes());
        });
        path
    }

    #[test]
    fn ask_speaks_the_hybrid_vsock_handshake_and_times_out() {
        let query = AgentQuery {
            pids: vec![7],
            devices: vec!["/dev/vdb".into()],
            ..AgentQuery::default()
        };
        let path = fake_vsock("OK 1073741824\n", ANSWER, Duration::ZERO);
        let answer = ask(&path, &query).unwrap();
        assert_eq!(answer.processes.len(), 2);
        let _ = std::fs::remove_file(&path);
        // Nothing listening on the guest's port: the VMM closes.
        let path = fake_vsock("", "", Duration::ZERO);
        assert_eq!(ask(&path, &query).unwrap_err(), AgentError::NotListening);
        let _ = std::fs::remove_file(&path);
        // An agent that never ends its answer.
        let path = fake_vsock("OK 5\n", "{", Duration::from_secs(3));
        let started = Instant::now();
        assert_eq!(
            ask_within(&path, &query, Duration::from_secs(2)).unwrap_err(),
            AgentError::Timeout
        );
        assert!(started.elapsed() < Duration::from_millis(2500));
        let _ = std::fs::remove_file(&path);
        // No socket at all.
        let e = ask(Path::new("/nonexistent/vsock.sock"), &query).unwrap_err();
        assert!(matches!(e, AgentError::Connect { .. }), "{e}");
    }
}

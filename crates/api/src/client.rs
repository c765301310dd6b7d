//! Blocking client for the API socket, used by `hakoniwa ctl`.
//!
//! One request per connection (`Connection: close`): a CLI invocation sends
//! a single request, so keep-alive would only add state. Every step has a
//! deadline so `ctl` cannot hang on a wedged VMM, and every failure is one
//! line an operator can act on.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::action::{
    AdviseRequest, ApiAction, BalloonTarget, DisplaySettings, DumpRequest, ErrorBody,
    IoTraceAction, IoTraceRequest, LatencyHistogramRequest, MigrateRequest, MmuSettings,
    SnapshotRequest, SptPages,
};
use crate::http::{self, is_timeout, parse_response_head, read_more, write_all_by};
use crate::Error;

/// Time allowed for a whole request/response exchange by [`request`] and
/// [`run_ctl`]. Generous, because the VMM may be busy (e.g. pausing vCPUs),
/// but finite, so scripts never hang.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time allowed for `snapshot`: the VMM writes all of guest RAM before it
/// answers.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);

/// Largest response accepted; far above any real answer, it only stops a
/// confused peer from making the client buffer without bound.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Sends one HTTP request over the Unix socket and returns the status code
/// and body, whatever the status. Uses [`DEFAULT_TIMEOUT`].
///
/// This is the raw building block (also handy for scripts and tests); use
/// [`run_ctl`] for the operator-facing commands.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), Error> {
    request_with_timeout(socket, method, path, body, DEFAULT_TIMEOUT)
}

/// [`request`] with an explicit deadline for the whole exchange.
pub fn request_with_timeout(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), Error> {
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(Error::InvalidRequest(format!(
            "invalid HTTP method {method:?}"
        )));
    }
    if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(Error::InvalidRequest(format!(
            "invalid request path {path:?}"
        )));
    }
    let deadline = Instant::now() + timeout;
    let transport = |error: io::Error| {
        if is_timeout(&error) {
            Error::Timeout {
                path: socket.to_owned(),
                timeout,
            }
        } else {
            Error::Transport {
                path: socket.to_owned(),
                error,
            }
        }
    };

    let mut stream = UnixStream::connect(socket).map_err(|error| Error::Connect {
        path: socket.to_owned(),
        error,
    })?;

    let mut message = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n"
    );
    match body {
        Some(body) => message.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )),
        None => message.push_str("Content-Length: 0\r\n\r\n"),
    }
    if let Err(e) = write_all_by(&mut stream, message.as_bytes(), deadline) {
        // The server may reject a request early (e.g. 413 for a large body)
        // and close before reading all of it; its answer is still readable
        // and says more than "broken pipe" would.
        if !matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            return Err(transport(e));
        }
    }

    let mut buf = Vec::new();
    let head = loop {
        match parse_response_head(&buf).map_err(Error::BadResponse)? {
            // Interim 1xx responses (e.g. 100 Continue) precede the real one.
            Some(head) if (100..200).contains(&head.status) => {
                buf.drain(..head.head_len);
                continue;
            }
            Some(head) => break head,
            None => {}
        }
        if buf.len() > MAX_RESPONSE_BYTES {
            return Err(Error::BadResponse("response header too large".into()));
        }
        match read_more(&mut stream, &mut buf, deadline) {
            Ok(0) if buf.is_empty() => {
                return Err(Error::Transport {
                    path: socket.to_owned(),
                    error: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the VMM closed the connection without answering",
                    ),
                })
            }
            Ok(0) => return Err(Error::BadResponse("truncated response header".into())),
            Ok(_) => {}
            Err(e) => return Err(transport(e)),
        }
    };
    if head.chunked {
        return Err(Error::BadResponse(
            "chunked responses are not supported".into(),
        ));
    }
    buf.drain(..head.head_len);

    let no_body = head.status == 204 || head.status == 304 || method == "HEAD";
    if !no_body {
        match head.content_length {
            Some(len) if len > MAX_RESPONSE_BYTES => {
                return Err(Error::BadResponse(format!(
                    "response body of {len} bytes is too large"
                )))
            }
            Some(len) => {
                while buf.len() < len {
                    match read_more(&mut stream, &mut buf, deadline) {
                        Ok(0) => return Err(Error::BadResponse("truncated response body".into())),
                        Ok(_) => {}
                        Err(e) => return Err(transport(e)),
                    }
                }
                buf.truncate(len);
            }
            // No length: the body runs to the end of the connection.
            None => loop {
                if buf.len() > MAX_RESPONSE_BYTES {
                    return Err(Error::BadResponse("response body too large".into()));
                }
                match read_more(&mut stream, &mut buf, deadline) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(transport(e)),
                }
            },
        }
    } else {
        buf.clear();
    }
    Ok((head.status, String::from_utf8_lossy(&buf).into_owned()))
}

/// `tchar` from RFC 9110: the bytes allowed in a method name.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The commands of `hakoniwa ctl`.
///
/// Separate from [`ApiAction`] because CLI verbs are a user interface
/// (short names, confirmation texts) while actions are the protocol; a verb
/// maps to exactly one action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CtlCommand {
    /// Check that the VMM answers; prints its version.
    Ping,
    /// Print the VM description as JSON.
    Info,
    /// Pause the VM.
    Pause,
    /// Resume a paused VM.
    Resume,
    /// Ask the VMM to shut the VM down and exit.
    Shutdown,
    /// Print the balloon's target, actual size and guest statistics.
    Balloon,
    /// Set the balloon's target: its size, or the guest's.
    BalloonSet(BalloonTarget),
    /// Print the paging mode, shadow-page budget and KVM MMU statistics.
    Mmu,
    /// Set the shadow-page budget.
    MmuSet(SptPages),
    /// Print the display's configuration and figures.
    Display,
    /// Switch the display's update detection and/or refresh mode.
    DisplaySet(DisplaySettings),
    /// Save the VM to this file (a path as the VMM sees it).
    Snapshot(String),
    /// Start migrating the VM.
    Migrate(MigrateRequest),
    /// Print the current or last migration's report.
    Migration,
    /// Write a failure report of the VM as it is now (to this file, or
    /// into the VM's --dump-dir).
    Dump(Option<String>),
    /// Print the isolation report of the VM's pinned CPUs.
    Isolation,
    /// Print every disk's and network device's counters.
    Counters,
    /// Set a disk's latency histogram boundaries.
    LatencyHistogramSet(LatencyHistogramRequest),
    /// Start, stop or report a disk's I/O trace.
    IoTrace(IoTraceRequest),
    /// The advisor's recommendation from a traced disk (and apply it).
    Advise(AdviseRequest),
}

impl CtlCommand {
    /// Every command that takes no argument, for help texts and parsers.
    pub const ALL: [CtlCommand; 11] = [
        CtlCommand::Ping,
        CtlCommand::Info,
        CtlCommand::Pause,
        CtlCommand::Resume,
        CtlCommand::Shutdown,
        CtlCommand::Balloon,
        CtlCommand::Mmu,
        CtlCommand::Display,
        CtlCommand::Migration,
        CtlCommand::Isolation,
        CtlCommand::Counters,
    ];

    /// The command's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            CtlCommand::Ping => "ping",
            CtlCommand::Info => "info",
            CtlCommand::Pause => "pause",
            CtlCommand::Resume => "resume",
            CtlCommand::Shutdown => "shutdown",
            CtlCommand::Balloon | CtlCommand::BalloonSet(_) => "balloon",
            CtlCommand::Mmu | CtlCommand::MmuSet(_) => "mmu",
            CtlCommand::Display | CtlCommand::DisplaySet(_) => "display",
            CtlCommand::Snapshot(_) => "snapshot",
            CtlCommand::Migrate(_) => "migrate",
            CtlCommand::Migration => "migration",
            CtlCommand::Dump(_) => "dump",
            CtlCommand::Isolation => "isolation",
            CtlCommand::Counters | CtlCommand::LatencyHistogramSet(_) => "counters",
            CtlCommand::IoTrace(_) => "iotrace",
            CtlCommand::Advise(_) => "advise",
        }
    }

    /// The API action the command performs.
    pub fn action(&self) -> ApiAction {
        match self.clone() {
            CtlCommand::Ping => ApiAction::Ping,
            CtlCommand::Info => ApiAction::VmInfo,
            CtlCommand::Pause => ApiAction::Pause,
            CtlCommand::Resume => ApiAction::Resume,
            CtlCommand::Shutdown => ApiAction::Shutdown,
            CtlCommand::Balloon => ApiAction::BalloonInfo,
            CtlCommand::BalloonSet(target) => ApiAction::BalloonSet(target),
            CtlCommand::Mmu => ApiAction::MmuInfo,
            CtlCommand::MmuSet(spt_pages) => ApiAction::MmuSet(MmuSettings { spt_pages }),
            CtlCommand::Display => ApiAction::DisplayInfo,
            CtlCommand::DisplaySet(settings) => ApiAction::DisplaySet(settings),
            CtlCommand::Snapshot(path) => ApiAction::Snapshot(SnapshotRequest { path }),
            CtlCommand::Migrate(request) => ApiAction::Migrate(request),
            CtlCommand::Migration => ApiAction::MigrationInfo,
            CtlCommand::Dump(path) => ApiAction::Dump(DumpRequest { path }),
            CtlCommand::Isolation => ApiAction::IsolationInfo,
            CtlCommand::Counters => ApiAction::Counters,
            CtlCommand::LatencyHistogramSet(request) => ApiAction::LatencyHistogramSet(request),
            CtlCommand::IoTrace(request) => ApiAction::IoTraceSet(request),
            CtlCommand::Advise(request) => ApiAction::Advise(request),
        }
    }

    /// What to print when the VMM accepted the command without data.
    fn confirmation(&self) -> &'static str {
        match self {
            CtlCommand::Ping => "VMM is alive",
            CtlCommand::Info => "no information returned",
            CtlCommand::Pause => "VM paused",
            CtlCommand::Resume => "VM resumed",
            CtlCommand::Shutdown => "VM shutdown requested",
            CtlCommand::Balloon => "no balloon information returned",
            CtlCommand::BalloonSet(_) => "balloon target set",
            CtlCommand::Mmu => "no MMU information returned",
            CtlCommand::MmuSet(_) => "shadow-page budget set",
            CtlCommand::Display => "no display information returned",
            CtlCommand::DisplaySet(_) => "display switched",
            CtlCommand::Snapshot(_) => "snapshot written",
            CtlCommand::Migrate(_) => "migration started",
            CtlCommand::Migration => "no migration information returned",
            CtlCommand::Dump(_) => "no report returned",
            CtlCommand::Isolation => "no isolation report returned",
            CtlCommand::Counters => "no counters returned",
            CtlCommand::LatencyHistogramSet(_) => "latency histogram set",
            CtlCommand::IoTrace(request) => match request.action {
                IoTraceAction::Start => "tracing started",
                IoTraceAction::Stop | IoTraceAction::Report => "no report returned",
            },
            CtlCommand::Advise(_) => "no advice returned",
        }
    }
}

impl std::fmt::Display for CtlCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CtlCommand {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CtlCommand::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = CtlCommand::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "unknown command {s:?}; expected one of: {}",
                    names.join(", ")
                )
            })
    }
}

/// Runs one `hakoniwa ctl` command and returns the text to print: pretty
/// JSON for commands that return data, a short confirmation otherwise.
///
/// Any non-2xx answer becomes [`Error::Refused`] with the VMM's own message,
/// so the operator sees why (e.g. "the VMM refused: VM is already paused
/// (HTTP 409)").
pub fn run_ctl(socket: &Path, command: &CtlCommand) -> Result<String, Error> {
    let spec = command
        .action()
        .to_request()
        .map_err(|e| Error::InvalidRequest(format!("cannot encode request: {e}")))?;
    let timeout = match command {
        CtlCommand::Snapshot(_) | CtlCommand::Dump(_) => SNAPSHOT_TIMEOUT,
        _ => DEFAULT_TIMEOUT,
    };
    let (status, body) = request_with_timeout(
        socket,
        spec.method.as_str(),
        spec.path,
        spec.body.as_deref(),
        timeout,
    )?;
    if !(200..300).contains(&status) {
        return Err(Error::Refused {
            status,
            message: error_message(status, &body),
        });
    }
    if body.trim().is_empty() {
        return Ok(command.confirmation().to_owned());
    }
    let value: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| Error::BadResponse(format!("invalid JSON from the VMM: {e}")))?;
    serde_json::to_string_pretty(&value)
        .map_err(|e| Error::BadResponse(format!("cannot format the VMM's answer: {e}")))
}

/// The message of an error response: the [`ErrorBody`] text if there is
/// one, else the raw body, else the status's reason phrase; always one line.
fn error_message(status: u16, body: &str) -> String {
    let text = match serde_json::from_str::<ErrorBody>(body) {
        Ok(e) => e.error,
        Err(_) if !body.trim().is_empty() => body.chars().take(200).collect(),
        Err(_) => http::reason_phrase(status).to_owned(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_names_round_trip() {
        for c in CtlCommand::ALL {
            assert_eq!(c.name().parse::<CtlCommand>().unwrap(), c);
        }
        let err = "frobnicate".parse::<CtlCommand>().unwrap_err();
        assert!(
            err.contains("ping, info, pause, resume, shutdown, balloon"),
            "{err}"
        );
    }

    #[test]
    fn error_messages_are_one_line() {
        assert_eq!(
            error_message(409, r#"{"error":"already\n  paused"}"#),
            "already paused"
        );
        assert_eq!(error_message(502, "bad\r\ngateway"), "bad gateway");
        assert_eq!(error_message(404, ""), "Not Found");
    }

    #[test]
    fn invalid_method_or_path_is_rejected_before_connecting() {
        let p = Path::new("/nonexistent/socket");
        assert!(matches!(
            request(p, "GET /x HTTP/1.1\r\n", "/", None),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            request(p, "GET", "/a b", None),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            request(p, "GET", "noslash", None),
            Err(Error::InvalidRequest(_))
        ));
    }
}

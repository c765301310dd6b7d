//! hakoniwa's control API: HTTP/1.1 + JSON over a Unix socket.
//!
//! This follows the Firecracker / Cloud Hypervisor convention, so operators
//! can use `curl --unix-socket` as well as `hakoniwa ctl`:
//!
//! - [`server::ApiServer`] runs inside the VMM (`--api-socket PATH`) on a
//!   background thread and forwards each request as an [`ApiAction`] to the
//!   VMM's [`VmController`];
//! - [`client`] is the blocking client behind `hakoniwa ctl`;
//! - [`endpoints`] is the single table mapping methods and paths to actions;
//!   adding an endpoint starts there.
//!
//! The wire format is described in `docs/api/openapi.yaml`.
//!
//! # Wiring it into the VMM
//!
//! ```
//! use std::sync::Arc;
//! use api::{ApiAction, ApiError, ApiResponse, ApiServer, CtlCommand, VmController, VmmVersion};
//!
//! struct Vmm;
//! impl VmController for Vmm {
//!     fn handle(&self, action: ApiAction) -> Result<ApiResponse, ApiError> {
//!         match action {
//!             ApiAction::Ping => Ok(ApiResponse::Pong(VmmVersion { version: "0.1.0".into() })),
//!             ApiAction::Pause => Err(ApiError::conflict("VM is already paused")),
//!             _ => Err(ApiError::not_implemented("not yet")),
//!         }
//!     }
//! }
//!
//! let path = std::env::temp_dir().join(format!("hakoniwa-doc-{}.sock", std::process::id()));
//! let server = ApiServer::start(&path, Arc::new(Vmm))?;       // --api-socket PATH
//! let out = api::run_ctl(&path, &CtlCommand::Ping)?;           // hakoniwa ctl ping
//! assert!(out.contains("\"version\": \"0.1.0\""));
//! let err = api::run_ctl(&path, &CtlCommand::Pause).unwrap_err();
//! assert_eq!(err.to_string(), "the VMM refused: VM is already paused (HTTP 409)");
//! drop(server); // removes the socket file
//! assert!(!path.exists());
//! # Ok::<(), api::Error>(())
//! ```

mod action;
pub mod client;
pub mod endpoints;
mod http;
pub mod server;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub use action::{
    AdviseRequest, ApiAction, ApiError, ApiResponse, BalloonGoal, BalloonInfo, BalloonTarget,
    Boundaries, DeviceInfo, DirtyMethod, DisplaySettings, DumpInfo, DumpRequest, ErrorBody,
    HostThread, IoTraceAction, IoTraceRequest, LatencyHistogram, LatencyHistogramRequest,
    MemoryBacking, MigrateRequest, MigrationMode, MmuInfo, MmuSettings, RefreshMode,
    SnapshotRequest, SptPages, VcpuThread, VmController, VmInfo, VmState, VmmVersion,
};
pub use client::{run_ctl, CtlCommand};
pub use server::{ApiServer, ServerOptions};

/// Errors of the API server's setup and of the client.
///
/// Every message is a single line meant to be printed as is (the underlying
/// I/O error is folded into the text rather than chained as a `source`, so
/// `anyhow`'s `{:#}` does not print it twice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another process (probably another hakoniwa) serves this socket.
    #[error("API socket {} is already in use by a running process", .0.display())]
    SocketInUse(PathBuf),
    /// The path exists and is not a socket; we never delete such files.
    #[error("refusing to use {} as the API socket: it exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// Creating, binding or preparing the socket failed.
    #[error("cannot set up API socket {}: {}", .path.display(), io_reason(.error))]
    Socket {
        /// Socket path.
        path: PathBuf,
        /// What failed.
        error: io::Error,
    },
    /// The server thread could not be started.
    #[error("cannot start the API server thread: {}", io_reason(.0))]
    Server(io::Error),
    /// The client could not reach the socket (no VMM, or no permission).
    #[error(
        "cannot connect to API socket {}: {} (is hakoniwa running with --api-socket?)",
        .path.display(),
        io_reason(.error)
    )]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Why `connect` failed.
        error: io::Error,
    },
    /// The connection broke during the exchange.
    #[error("lost the connection to the VMM on API socket {}: {}", .path.display(), io_reason(.error))]
    Transport {
        /// Socket path.
        path: PathBuf,
        /// What failed.
        error: io::Error,
    },
    /// The VMM did not answer in time.
    #[error(
        "no answer from the VMM on API socket {} within {} s",
        .path.display(),
        .timeout.as_secs_f32()
    )]
    Timeout {
        /// Socket path.
        path: PathBuf,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The caller asked for a request that cannot be sent.
    #[error("invalid API request: {0}")]
    InvalidRequest(String),
    /// The peer answered with something that is not a usable HTTP response.
    #[error("malformed response from the VMM: {0}")]
    BadResponse(String),
    /// The VMM answered with a non-2xx status.
    #[error("the VMM refused: {message} (HTTP {status})")]
    Refused {
        /// HTTP status code.
        status: u16,
        /// The VMM's explanation.
        message: String,
    },
}

/// An I/O error's description without Rust's " (os error N)" suffix, which
/// means nothing to an operator. Shared by every one-line error hakoniwa prints.
pub fn io_reason(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_owned(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_error_is_one_clear_line() {
        let e = Error::Connect {
            path: "/x/y".into(),
            error: io::Error::from_raw_os_error(2),
        };
        assert_eq!(
            e.to_string(),
            "cannot connect to API socket /x/y: No such file or directory \
             (is hakoniwa running with --api-socket?)"
        );
        let e = Error::Refused {
            status: 409,
            message: "VM is already paused".into(),
        };
        assert_eq!(
            e.to_string(),
            "the VMM refused: VM is already paused (HTTP 409)"
        );
    }
}

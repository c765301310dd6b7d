//! The virtio-vsock device: configuration (the guest CID), lifecycle, and
//! the host listening socket.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vmm_sys_util::epoll::Epoll;

use super::handler::VsockHandler;
use super::muxer::VsockMuxer;
use super::{
    VsockConfig, VsockMetrics, VsockMetricsSnapshot, EVENT_QUEUE, QUEUE_SIZE, RX_QUEUE, TX_QUEUE,
};
use crate::options::OptionsError;
use crate::virtio::lifecycle::{self, queue_array, ActiveQueues, DeviceLifecycle, QueueDevice};
use crate::virtio::{
    ActivateError, Activation, DeviceState, StateError, VirtioDevice, COMMON_FEATURES,
};

/// What a snapshot keeps of a vsock device: its configuration. Connections
/// are not kept: they join guest sockets to host sockets of the VMM that
/// took the snapshot. A restored device sends the guest a TRANSPORT_RESET
/// event instead, and the guest drops its connections (as with
/// Firecracker); listening sockets and new connections work as before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The guest's CID.
    pub cid: u64,
}

/// Why a vsock device could not be made (one line; the caller names the
/// flag).
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    #[error("{0}")]
    Options(#[from] OptionsError),
    #[error("{path}: {reason}")]
    Socket { path: String, reason: String },
}

/// A virtio-vsock device (device id 19).
pub struct Vsock {
    id: String,
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    metrics: Arc<VsockMetrics>,
    lifecycle: DeviceLifecycle<VsockHandler>,
}

impl Vsock {
    /// Parses `--vsock` options and binds the host socket. `default_id`
    /// names the device when the options give no `id=`.
    pub fn from_options(text: &str, default_id: &str) -> Result<Vsock, VsockError> {
        Vsock::new(&VsockConfig::parse(text)?, default_id)
    }

    /// Binds `config.uds` (replacing a stale socket nobody listens on).
    pub fn new(config: &VsockConfig, default_id: &str) -> Result<Vsock, VsockError> {
        let listener = bind_listener(&config.uds).map_err(|reason| VsockError::Socket {
            path: config.uds.display().to_string(),
            reason,
        })?;
        Ok(Vsock {
            id: config.id.clone().unwrap_or_else(|| default_id.to_string()),
            cid: config.cid,
            uds_path: config.uds.clone(),
            listener,
            metrics: Arc::new(VsockMetrics::default()),
            lifecycle: DeviceLifecycle::default(),
        })
    }

    /// The guest's CID.
    pub fn cid(&self) -> u64 {
        self.cid
    }

    /// The host socket host programs connect to.
    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// The device's counters (live).
    pub fn metrics(&self) -> Arc<VsockMetrics> {
        self.metrics.clone()
    }

    pub fn metrics_snapshot(&self) -> VsockMetricsSnapshot {
        self.metrics.snapshot()
    }
}

fn bind_listener(path: &Path) -> Result<UnixListener, String> {
    match UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                return Err("exists and is not a socket".into());
            }
            match UnixStream::connect(path) {
                Ok(_) => Err("in use (something listens there)".into()),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // A socket left behind by a process that is gone.
                    std::fs::remove_file(path)
                        .map_err(|e| format!("cannot remove stale socket: {e}"))?;
                    UnixListener::bind(path).map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("exists and cannot be checked: {e}")),
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        lifecycle::reset(self);
        let _ = std::fs::remove_file(&self.uds_path);
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE, QUEUE_SIZE]
    }

    fn device_features(&self) -> u64 {
        COMMON_FEATURES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_vsock_config { le64 guest_cid; }; zeros beyond.
        crate::virtio::read_config_bytes(&self.cid.to_le_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        tracing::debug!(
            "{}: ignored config write of {} bytes at {offset}",
            self.id,
            data.len()
        );
    }

    // A reset stops the worker; dropping the muxer closes every
    // connection. Host programs still in the listen backlog wait for the
    // next activation.
    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        DeviceState::Vsock(VsockState { cid: self.cid })
    }
}

impl QueueDevice for Vsock {
    type Loop = VsockHandler;

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<VsockHandler> {
        &mut self.lifecycle
    }

    /// The worker's loop over the queues, with a fresh muxer; a restored
    /// device owes the guest a TRANSPORT_RESET (see [`VsockState`]).
    fn serve(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<VsockHandler, ActivateError> {
        let [rx, tx, ev] = queue_array(queues.queues)?;
        debug_assert_eq!(
            (rx.index, tx.index, ev.index),
            (RX_QUEUE, TX_QUEUE, EVENT_QUEUE)
        );
        let muxer = VsockMuxer::new(
            self.cid,
            self.uds_path.clone(),
            self.listener.try_clone()?,
            Epoll::new()?,
            self.metrics.clone(),
        )?;
        let mut handler = VsockHandler::new(queues.memory, queues.interrupt, rx, tx, ev, muxer);
        if restoring.is_some() {
            handler.owe_transport_reset();
        }
        Ok(handler)
    }

    fn check_state(&self, state: &DeviceState, _: Option<&Activation>) -> Result<(), StateError> {
        let DeviceState::Vsock(saved) = state else {
            return Err(state.wrong_kind("vsock"));
        };
        if saved.cid != self.cid {
            return Err(StateError::Mismatch(format!(
                "the guest's CID was {}, --vsock gives {}",
                saved.cid, self.cid
            )));
        }
        Ok(())
    }
}

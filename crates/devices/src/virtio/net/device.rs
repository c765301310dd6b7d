//! The virtio-net device: features, configuration space, lifecycle.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};

use super::handler::{NetHandler, NetLoop};
use super::{
    derived_mac, NetBackend, NetConfig, NetMetrics, NetMetricsSnapshot, Tap, TapError, QUEUE_SIZE,
    RX_QUEUE, TX_QUEUE,
};
use crate::affinity::CpuSet;
use crate::options::OptionsError;
use crate::virtio::lifecycle::{
    self, queue_array, ActiveQueues, DeviceLifecycle, QueueDevice, QueueLoop,
};
use crate::virtio::{
    ActivateError, Activation, DeviceState, QueuePosition, StateError, VirtioDevice,
    COMMON_FEATURES,
};

const fn bit(b: u32) -> u64 {
    1 << b
}

/// Offloads: the guest may hand us partially checksummed and TSO frames
/// (the TAP accepts them as they are), and may take them from us if it
/// says so (then the TAP is told, with TUNSETOFFLOAD, that it may send them).
const OFFLOAD_FEATURES: u64 = bit(VIRTIO_NET_F_CSUM)
    | bit(VIRTIO_NET_F_GUEST_CSUM)
    | bit(VIRTIO_NET_F_GUEST_TSO4)
    | bit(VIRTIO_NET_F_GUEST_TSO6)
    | bit(VIRTIO_NET_F_HOST_TSO4)
    | bit(VIRTIO_NET_F_HOST_TSO6);

/// Size of the configuration space we expose: mac[6], status u16,
/// max_virtqueue_pairs u16, mtu u16.
const CONFIG_LEN: usize = 12;

/// What a snapshot keeps of a net device: the configuration space and
/// features the guest's driver read at probe time. A restore needs the
/// same (`--net` with the same MAC and MTU); frames in flight on the wire
/// are not part of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// `mac`, `status`, `max_virtqueue_pairs`, `mtu`, as the guest reads them.
    pub config: Vec<u8>,
    /// The feature bits offered.
    pub features: u64,
}

/// Why a net device could not be made (one line; the caller names the
/// flag).
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Options(#[from] OptionsError),
    #[error("{0}")]
    Tap(#[from] TapError),
    #[error("option iothread_affinity: {0}")]
    Affinity(String),
}

/// A virtio-net device (device id 1).
pub struct Net {
    id: String,
    backend: Arc<dyn NetBackend>,
    mac: [u8; 6],
    features: u64,
    config: [u8; CONFIG_LEN],
    metrics: Arc<NetMetrics>,
    lifecycle: DeviceLifecycle<NetLoop>,
    /// The host CPUs the device's thread runs on.
    iothread_affinity: Option<CpuSet>,
}

impl Net {
    /// Parses `--net` options and opens the TAP. `default_id` names the
    /// device when the options give no `id=` (e.g. "net0").
    pub fn from_options(text: &str, default_id: &str) -> Result<Net, NetError> {
        let config = NetConfig::parse(text)?;
        Net::new(&config, default_id)
    }

    /// Opens the TAP of `config`.
    pub fn new(config: &NetConfig, default_id: &str) -> Result<Net, NetError> {
        if let Some(cpus) = &config.iothread_affinity {
            cpus.check_allowed().map_err(NetError::Affinity)?;
        }
        let tap = Tap::open(&config.tap)?;
        let id = config.id.clone().unwrap_or_else(|| default_id.to_string());
        let mac = config
            .mac
            .unwrap_or_else(|| derived_mac(config.id.as_deref().unwrap_or(&config.tap)));
        let mut net = Net::with_backend(id, Arc::new(tap), mac, config.mtu);
        net.iothread_affinity = config.iothread_affinity.clone();
        Ok(net)
    }

    /// A device over any back end (tests, other back ends).
    pub fn with_backend(
        id: String,
        backend: Arc<dyn NetBackend>,
        mac: [u8; 6],
        mtu: Option<u16>,
    ) -> Net {
        let mut features = COMMON_FEATURES
            | bit(VIRTIO_NET_F_MAC)
            | bit(VIRTIO_NET_F_STATUS)
            | bit(VIRTIO_NET_F_MRG_RXBUF)
            | OFFLOAD_FEATURES;
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&mac);
        config[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        config[8..10].copy_from_slice(&1u16.to_le_bytes());
        if let Some(mtu) = mtu {
            features |= bit(VIRTIO_NET_F_MTU);
            config[10..12].copy_from_slice(&mtu.to_le_bytes());
        }
        Net {
            id,
            backend,
            mac,
            features,
            config,
            metrics: Arc::new(NetMetrics::default()),
            lifecycle: DeviceLifecycle::default(),
            iothread_affinity: None,
        }
    }

    /// The guest's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The back end's name (the TAP interface).
    pub fn backend_name(&self) -> &str {
        self.backend.name()
    }

    /// The device's counters (live).
    pub fn metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    /// A copy of the counters.
    pub fn metrics_snapshot(&self) -> NetMetricsSnapshot {
        self.metrics.snapshot()
    }
}

/// The TUN_F_* offloads the TAP may use towards a guest with `acked`.
pub(crate) fn tap_offloads(acked: u64) -> u32 {
    let mut flags = 0;
    if acked & bit(VIRTIO_NET_F_GUEST_CSUM) != 0 {
        flags |= libc::TUN_F_CSUM;
        if acked & bit(VIRTIO_NET_F_GUEST_TSO4) != 0 {
            flags |= libc::TUN_F_TSO4;
        }
        if acked & bit(VIRTIO_NET_F_GUEST_TSO6) != 0 {
            flags |= libc::TUN_F_TSO6;
        }
    }
    flags
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        virtio_bindings::virtio_ids::VIRTIO_ID_NET
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn device_features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Every field is read-only for a virtio 1.x driver.
        tracing::debug!(
            "{}: ignored config write of {} bytes at {offset}",
            self.id,
            data.len()
        );
    }

    lifecycle::lifecycle_methods!();

    fn save_state(&self) -> DeviceState {
        DeviceState::Net(NetState {
            config: self.config.to_vec(),
            features: self.features,
        })
    }
}

impl QueueDevice for Net {
    type Loop = NetLoop;

    fn lifecycle(&mut self) -> &mut DeviceLifecycle<NetLoop> {
        &mut self.lifecycle
    }

    fn thread_affinity(&self) -> Option<CpuSet> {
        self.iothread_affinity.clone()
    }

    /// The loop over the rx and tx queues; the back end gets the offloads
    /// the driver accepted (a restored device's TAP too), and a restored
    /// device announces the guest's MAC first thing once it serves.
    fn serve(
        &mut self,
        queues: ActiveQueues,
        restoring: Option<&DeviceState>,
    ) -> Result<NetLoop, ActivateError> {
        let acked_features = queues.acked_features;
        let [rx, tx] = queue_array(queues.queues)?;
        debug_assert_eq!((rx.index, tx.index), (RX_QUEUE, TX_QUEUE));
        self.backend
            .set_offload(tap_offloads(acked_features))
            .map_err(|e| {
                ActivateError::Backend(format!("{}: TUNSETOFFLOAD failed: {e}", self.id))
            })?;
        let mut handler = NetHandler::new(
            queues.memory,
            queues.interrupt,
            rx,
            tx,
            self.backend.clone(),
            acked_features & bit(VIRTIO_NET_F_MRG_RXBUF) != 0,
            self.metrics.clone(),
        );
        if restoring.is_some() {
            // The guest may now sit behind another switch port (a live
            // migration) than the one its MAC was learnt on.
            handler.announce(announcement(self.mac));
        }
        Ok(NetLoop::new(handler)?)
    }

    fn check_state(&self, state: &DeviceState, _: Option<&Activation>) -> Result<(), StateError> {
        let DeviceState::Net(saved) = state else {
            return Err(state.wrong_kind("net"));
        };
        if saved.config.len() != CONFIG_LEN {
            return Err(StateError::Invalid(format!(
                "net configuration of {} bytes, not {CONFIG_LEN}",
                saved.config.len()
            )));
        }
        // The guest's driver took its MAC and MTU at probe time.
        if saved.config[..6] != self.config[..6] {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&saved.config[..6]);
            return Err(StateError::Mismatch(format!(
                "the guest's MAC is {}, --net gives {}",
                super::format_mac(&mac),
                super::format_mac(&self.mac)
            )));
        }
        if saved.config != self.config || saved.features != self.features {
            return Err(StateError::Mismatch(
                "the device had another MTU or features; give --net the same options".into(),
            ));
        }
        Ok(())
    }
}

/// Frames are moved whole on the worker thread: once it is parked nothing
/// is half done. A frame read from the back end that the guest had no
/// buffer for stays with the handler.
impl QueueLoop for NetLoop {
    fn positions(&self) -> Vec<QueuePosition> {
        self.handler.positions()
    }
}

/// What a restored device sends first, as QEMU's self-announce does after
/// a migration: a broadcast RARP request from the guest's MAC (EtherType
/// 0x8035; hardware Ethernet, protocol IPv4, sender and target the MAC),
/// padded to the 60-byte minimum, behind an empty vnet header. Switches
/// and bridges learn from it which port the MAC is behind now.
pub(super) fn announcement(mac: [u8; 6]) -> Vec<u8> {
    let mut frame = vec![0u8; super::NET_HDR_LEN];
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0x80, 0x35]);
    // htype 1, ptype 0x0800, hlen 6, plen 4, op 3 (reverse request).
    frame.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 3]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0; 4]);
    frame.resize(super::NET_HDR_LEN + 60, 0);
    frame
}

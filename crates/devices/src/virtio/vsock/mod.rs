//! virtio-vsock (being written).

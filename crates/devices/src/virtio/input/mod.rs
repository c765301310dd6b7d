//! virtio-input (being written).

//! virtio-block (being written).

//! virtio-net (being written).

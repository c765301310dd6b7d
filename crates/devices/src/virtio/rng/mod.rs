//! virtio-rng (being written).

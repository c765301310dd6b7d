//! virtio-balloon (being written).

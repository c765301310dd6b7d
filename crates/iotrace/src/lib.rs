//! The KVM-free core of the I/O-cache tracer (seed 002, docs/iotrace.md).
//!
//! A guest's read can be served by its own page cache, by the host's page
//! cache under the image file, or by the device. This crate holds what
//! decides which, without a VM:
//!
//! - [`host_cache`]: whether the host page cache holds a range of an image
//!   file (`preadv2(RWF_NOWAIT)` and `mincore`);
//! - [`reuse`]: reuse distances of a block trace, the hit ratio of every LRU
//!   cache size, and the working set;
//! - [`layers`]: the report of a traced window, layer by layer (application,
//!   virtual disk, physical device), the cache hit ratios that follow, and
//!   the bytes cached twice;
//! - [`physical`]: the host block device under an image and its
//!   `/sys/block/*/stat` counters, the physical layer;
//! - [`advisor`]: guest memory, buffered or direct I/O, guest swap and the
//!   disk's cache mode, from a report and a reuse profile.

pub mod advisor;
pub mod host_cache;
pub mod layers;
pub mod physical;
pub mod reuse;

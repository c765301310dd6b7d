//! The report of one traced window: the three layers side by side.
//!
//! A guest read passes three layers (the paper's section 4.1): the
//! **application** (what the program asked of its files), the **virtual
//! disk** (the virtio-blk requests hakoniwa serves) and the **physical
//! device** (the requests reaching the host's block device under the
//! image). The guest page cache sits between the first two, the host page
//! cache between the last two, so comparing the layers' bytes says which
//! cache served what, and the requests' counts and sizes say how the I/O
//! was cut up on the way (the paper's figures 8–11, per application
//! operation).
//!
//! Everything here is a pure function of the records and facts it is
//! given.

use std::collections::{BTreeSet, HashSet};

use crate::reuse::Access;

/// Where a request was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// File reads and writes of the traced program, in the guest.
    Application,
    /// virtio-blk requests, in the VMM.
    VirtualDisk,
    /// Requests to the host block device under the image file.
    PhysicalDevice,
}

/// A request's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Read,
    Write,
}

/// One request seen at one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoRecord {
    pub layer: Layer,
    /// When the layer saw the request, in nanoseconds on one clock shared
    /// by the three layers.
    pub time_ns: u64,
    pub direction: Direction,
    /// The byte offset in what the layer addresses: the file
    /// (application), the virtual disk, the host device.
    pub offset: u64,
    pub bytes: u64,
    /// Virtual-disk reads only, when probed ([`crate::host_cache`]): the
    /// bytes of the request the host page cache held as it was issued.
    pub host_cached_bytes: Option<u64>,
}

/// A traced window: records with `start_ns <= time_ns < end_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Window {
    fn contains(&self, time_ns: u64) -> bool {
        self.start_ns <= time_ns && time_ns < self.end_ns
    }
}

/// What the caches held at the window's end, for the bytes cached twice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheFacts {
    /// The guest's page cache (`Cached` in its /proc/meminfo, or the
    /// balloon's `disk_caches`); `None` when the guest did not say.
    pub guest_cache_bytes: Option<u64>,
    /// What the host page cache holds of the image.
    pub host_cache: Option<HostCacheView>,
}

/// The host page cache's contents for the image, as known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostCacheView {
    /// Measured: the image's blocks `mincore` found resident.
    ResidentBlocks(BTreeSet<u64>),
    /// Only its size is known (0 with cache=none): assumed to hold the
    /// virtual disk's most recently used blocks, as an LRU cache would.
    CapacityBytes(u64),
}

/// One layer's totals in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerStats {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_requests: u64,
    pub write_requests: u64,
    /// Average bytes per read request (`None` without reads).
    pub average_read_bytes: Option<f64>,
    /// Average bytes per write request (`None` without writes).
    pub average_write_bytes: Option<f64>,
    /// Average bytes per request, reads and writes together.
    pub average_request_bytes: Option<f64>,
}

impl LayerStats {
    /// Totals from counters alone, e.g. the deltas of a guest process's
    /// `/proc/PID/io` (`rchar`, `wchar`, `syscr`, `syscw`) when the
    /// application layer has no per-request records.
    pub fn from_counters(
        read_bytes: u64,
        write_bytes: u64,
        read_requests: u64,
        write_requests: u64,
    ) -> Self {
        Self {
            read_bytes,
            write_bytes,
            read_requests,
            write_requests,
            average_read_bytes: ratio(read_bytes, read_requests),
            average_write_bytes: ratio(write_bytes, write_requests),
            average_request_bytes: ratio(read_bytes + write_bytes, read_requests + write_requests),
        }
    }

    fn of<'r>(records: impl Iterator<Item = &'r IoRecord>) -> Self {
        let (mut rb, mut wb, mut rr, mut wr) = (0, 0, 0, 0);
        for record in records {
            match record.direction {
                Direction::Read => {
                    rb += record.bytes;
                    rr += 1;
                }
                Direction::Write => {
                    wb += record.bytes;
                    wr += 1;
                }
            }
        }
        Self::from_counters(rb, wb, rr, wr)
    }

    /// Requests of both directions.
    pub fn requests(&self) -> u64 {
        self.read_requests + self.write_requests
    }

    /// Bytes of both directions.
    pub fn bytes(&self) -> u64 {
        self.read_bytes + self.write_bytes
    }
}

/// One layer's I/O per application operation (the paper's figures 8–10).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PerOperation {
    pub bytes: f64,
    pub requests: f64,
}

/// The three layers per application operation (`None` without any).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PerApplicationOperation {
    pub application: PerOperation,
    pub virtual_disk: PerOperation,
    pub physical_device: PerOperation,
}

/// What the guest page cache did for reads.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GuestCacheStats {
    /// Application bytes read that did not reach the virtual disk:
    /// `1 - virtual disk read bytes / application read bytes`, floored at 0.
    pub hit_ratio: Option<f64>,
    /// `virtual disk read bytes / application read bytes`: above 1 the guest
    /// read more than was asked (readahead, whole pages for small reads),
    /// which the floored hit ratio hides.
    pub read_amplification: Option<f64>,
}

/// What the host page cache did for reads.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostCacheStats {
    /// The layers' difference, as the paper measures it:
    /// `1 - physical read bytes / virtual disk read bytes`, floored at 0.
    pub hit_ratio: Option<f64>,
    /// `physical read bytes / virtual disk read bytes`.
    pub read_amplification: Option<f64>,
    /// Measured per request: host-cached bytes of the probed virtual-disk
    /// reads over their bytes.
    pub probed_hit_ratio: Option<f64>,
    /// Virtual-disk read bytes that were probed.
    pub probed_read_bytes: u64,
}

/// The estimate of the bytes held by both the guest and the host cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DoubleCached {
    pub bytes: u64,
    /// The guest cache's estimated share of this disk's blocks.
    pub guest_blocks: u64,
    /// How the host's share was known.
    pub host_view: HostViewKind,
}

/// How the host cache's contents were known for [`DoubleCached`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostViewKind {
    Measured,
    AssumedLru,
}

/// The report of one window.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowReport {
    pub window: Window,
    pub application: LayerStats,
    pub virtual_disk: LayerStats,
    pub physical_device: LayerStats,
    pub per_application_operation: Option<PerApplicationOperation>,
    pub guest_cache: GuestCacheStats,
    pub host_cache: HostCacheStats,
    /// `None` without the guest's cache size or a view of the host's.
    pub double_cached: Option<DoubleCached>,
    /// Layers not traced in this window (reported as zeros, and no ratio
    /// uses them).
    #[serde(default)]
    pub absent_layers: Vec<Layer>,
}

/// The report of `window` from the records of every layer (records outside
/// the window are ignored).
pub fn report(
    window: Window,
    records: &[IoRecord],
    facts: &CacheFacts,
    block_bytes: u64,
) -> WindowReport {
    let application = layer_stats(window, records, Layer::Application);
    report_with_application(window, application, records, facts, block_bytes)
}

/// As [`report`], with the application layer given as totals (from
/// counters, see [`LayerStats::from_counters`]); application records in
/// `records` are ignored.
pub fn report_with_application(
    window: Window,
    application: LayerStats,
    records: &[IoRecord],
    facts: &CacheFacts,
    block_bytes: u64,
) -> WindowReport {
    let physical_device = layer_stats(window, records, Layer::PhysicalDevice);
    report_from_layers(
        window,
        LayerTotals {
            application: Some(application),
            physical_device: Some(physical_device),
        },
        records,
        facts,
        block_bytes,
    )
}

/// The layers known only as totals (counters), or not at all (`None`):
/// an absent layer is reported as zeros, listed in
/// [`WindowReport::absent_layers`], and every ratio that needs it is
/// `None` (a layer not seen is not a layer that saw nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerTotals {
    pub application: Option<LayerStats>,
    pub physical_device: Option<LayerStats>,
}

/// As [`report`], with the application and physical layers given as
/// totals or absent (e.g. the host device's `/sys/block/*/stat` deltas,
/// [`crate::physical`], and the guest agent's `/proc/PID/io` deltas or no
/// application layer); only the virtual disk's
/// records are read from `records`.
pub fn report_from_layers(
    window: Window,
    totals: LayerTotals,
    records: &[IoRecord],
    facts: &CacheFacts,
    block_bytes: u64,
) -> WindowReport {
    let mut absent_layers = Vec::new();
    if totals.application.is_none() {
        absent_layers.push(Layer::Application);
    }
    if totals.physical_device.is_none() {
        absent_layers.push(Layer::PhysicalDevice);
    }
    let application = totals.application.unwrap_or_default();
    let physical_device = totals.physical_device.unwrap_or_default();
    let virtual_disk = layer_stats(window, records, Layer::VirtualDisk);

    let operations = application.requests();
    let per_op = |stats: &LayerStats| PerOperation {
        bytes: stats.bytes() as f64 / operations as f64,
        requests: stats.requests() as f64 / operations as f64,
    };
    let per_application_operation = (operations > 0).then(|| PerApplicationOperation {
        application: per_op(&application),
        virtual_disk: per_op(&virtual_disk),
        physical_device: per_op(&physical_device),
    });

    let guest_amplification = ratio(virtual_disk.read_bytes, application.read_bytes)
        .filter(|_| totals.application.is_some());
    let guest_cache = GuestCacheStats {
        hit_ratio: guest_amplification.map(|a| (1.0 - a).max(0.0)),
        read_amplification: guest_amplification,
    };

    let (probed_read_bytes, probed_cached_bytes) = records
        .iter()
        .filter(|r| in_layer(window, r, Layer::VirtualDisk) && r.direction == Direction::Read)
        .filter_map(|r| {
            r.host_cached_bytes
                .map(|cached| (r.bytes, cached.min(r.bytes)))
        })
        .fold((0, 0), |(read, cached), (r, c)| (read + r, cached + c));
    let host_amplification = ratio(physical_device.read_bytes, virtual_disk.read_bytes)
        .filter(|_| totals.physical_device.is_some());
    let host_cache = HostCacheStats {
        hit_ratio: host_amplification.map(|a| (1.0 - a).max(0.0)),
        read_amplification: host_amplification,
        probed_hit_ratio: ratio(probed_cached_bytes, probed_read_bytes),
        probed_read_bytes,
    };

    let double_cached = double_cached(window, records, facts, block_bytes);
    WindowReport {
        window,
        application,
        virtual_disk,
        physical_device,
        per_application_operation,
        guest_cache,
        host_cache,
        double_cached,
        absent_layers,
    }
}

/// The virtual disk's block trace in the window, reads and writes in time
/// order.
pub fn virtual_disk_blocks(window: Window, records: &[IoRecord], block_bytes: u64) -> Vec<u64> {
    virtual_disk_accesses(window, records, block_bytes)
        .into_iter()
        .map(Access::block)
        .collect()
}

/// The same trace for a profile of re-reads
/// ([`crate::reuse::ReuseProfile::from_accesses`]): reads counted, writes
/// only touching their blocks. Counted too, a file system's rewrites of
/// the same blocks (inode tables and bitmaps, at every file write) would
/// read as data read again at short distances.
pub fn virtual_disk_accesses(
    window: Window,
    records: &[IoRecord],
    block_bytes: u64,
) -> Vec<Access> {
    let mut requests: Vec<&IoRecord> = records
        .iter()
        .filter(|r| in_layer(window, r, Layer::VirtualDisk))
        .collect();
    requests.sort_by_key(|r| r.time_ns);
    requests
        .iter()
        .flat_map(|r| {
            let read = r.direction == Direction::Read;
            crate::reuse::blocks_of(r.offset, r.bytes, block_bytes).map(move |block| {
                if read {
                    Access::Counted(block)
                } else {
                    Access::Touch(block)
                }
            })
        })
        .collect()
}

/// The bytes cached twice, estimated.
///
/// Every block that crossed the virtual disk went through the guest's page
/// cache (unless the guest used direct I/O, in which case its small
/// `Cached` bounds the estimate) and, with the host cache on, through the
/// host's. The guest keeps the most recently used ones: walking the
/// window's virtual-disk blocks from the newest, the distinct blocks up to
/// the guest cache's size are taken as the guest's share `G` (an upper
/// bound: the guest also caches other files and disks, and blocks its
/// programs re-read from its cache stay fresh there without crossing the
/// disk). The host's share `H` is what `mincore` found resident, or, if
/// only its size is known, the same walk up to that size. The estimate is
/// `|G ∩ H|` blocks. Blocks cached before the window are not counted.
fn double_cached(
    window: Window,
    records: &[IoRecord],
    facts: &CacheFacts,
    block_bytes: u64,
) -> Option<DoubleCached> {
    let guest_capacity = facts.guest_cache_bytes? / block_bytes;
    let host = facts.host_cache.as_ref()?;
    let trace = virtual_disk_blocks(window, records, block_bytes);
    let mut guest_share: HashSet<u64> = HashSet::new();
    let mut recency: Vec<u64> = Vec::new(); // distinct blocks, newest first
    for &block in trace.iter().rev() {
        if guest_share.len() as u64 >= guest_capacity {
            break;
        }
        if guest_share.insert(block) {
            recency.push(block);
        }
    }
    let (blocks, host_view) = match host {
        HostCacheView::ResidentBlocks(resident) => (
            recency.iter().filter(|b| resident.contains(b)).count() as u64,
            HostViewKind::Measured,
        ),
        HostCacheView::CapacityBytes(bytes) => (
            (recency.len() as u64).min(bytes / block_bytes),
            HostViewKind::AssumedLru,
        ),
    };
    Some(DoubleCached {
        bytes: blocks * block_bytes,
        guest_blocks: recency.len() as u64,
        host_view,
    })
}

fn layer_stats(window: Window, records: &[IoRecord], layer: Layer) -> LayerStats {
    LayerStats::of(records.iter().filter(|r| in_layer(window, r, layer)))
}

fn in_layer(window: Window, record: &IoRecord, layer: Layer) -> bool {
    record.layer == layer && window.contains(record.time_ns)
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const BLOCK: u64 = 4 * KIB;
    const WINDOW: Window = Window {
        start_ns: 1_000,
        end_ns: 2_000,
    };

    fn record(
        layer: Layer,
        time_ns: u64,
        direction: Direction,
        offset: u64,
        bytes: u64,
    ) -> IoRecord {
        IoRecord {
            layer,
            time_ns,
            direction,
            offset,
            bytes,
            host_cached_bytes: None,
        }
    }

    fn read(layer: Layer, time_ns: u64, offset: u64, bytes: u64) -> IoRecord {
        record(layer, time_ns, Direction::Read, offset, bytes)
    }

    /// The paper's figure 9 in miniature: a buffered 16 KiB application
    /// read becomes many small virtual-disk reads (more bytes than asked:
    /// readahead), and the host device sees fewer, larger ones.
    fn buffered_big_data_set() -> Vec<IoRecord> {
        let mut records = vec![
            read(Layer::Application, 1_100, 0, 16 * KIB),
            read(Layer::Application, 1_500, 64 * KIB, 16 * KIB),
            record(Layer::Application, 1_600, Direction::Write, 0, 16 * KIB),
            // Outside the window: ignored.
            read(Layer::Application, 2_000, 0, 16 * KIB),
            read(Layer::VirtualDisk, 999, 0, 4 * KIB),
        ];
        // 10 virtual-disk reads of 4 KiB each: 40 KiB for 32 KiB asked.
        for i in 0..10 {
            let mut r = read(Layer::VirtualDisk, 1_110 + i, i * BLOCK, 4 * KIB);
            // The host cache held the first 6.
            r.host_cached_bytes = Some(if i < 6 { 4 * KIB } else { 0 });
            records.push(r);
        }
        records.push(record(
            Layer::VirtualDisk,
            1_700,
            Direction::Write,
            0,
            16 * KIB,
        ));
        // The host device read 16 KiB in one request, and wrote 16 KiB.
        records.push(read(Layer::PhysicalDevice, 1_120, 24 * KIB, 16 * KIB));
        records.push(record(
            Layer::PhysicalDevice,
            1_800,
            Direction::Write,
            0,
            16 * KIB,
        ));
        records
    }

    #[test]
    fn layers_bytes_requests_and_sizes() {
        let window_report = report(
            WINDOW,
            &buffered_big_data_set(),
            &CacheFacts::default(),
            BLOCK,
        );
        assert_eq!(window_report.application.read_bytes, 32 * KIB);
        assert_eq!(window_report.application.write_bytes, 16 * KIB);
        assert_eq!(window_report.application.requests(), 3);
        assert_eq!(
            window_report.application.average_read_bytes,
            Some(16.0 * 1024.0)
        );
        assert_eq!(window_report.virtual_disk.read_requests, 10);
        assert_eq!(window_report.virtual_disk.read_bytes, 40 * KIB);
        assert_eq!(window_report.virtual_disk.average_read_bytes, Some(4096.0));
        assert_eq!(
            window_report.virtual_disk.average_request_bytes,
            Some(56.0 * 1024.0 / 11.0)
        );
        assert_eq!(window_report.physical_device.requests(), 2);
        assert_eq!(
            window_report.physical_device.average_request_bytes,
            Some(16.0 * 1024.0)
        );

        let per_op = window_report.per_application_operation.unwrap();
        assert_eq!(per_op.application.bytes, 16.0 * 1024.0);
        assert_eq!(per_op.virtual_disk.requests, 11.0 / 3.0);
        assert_eq!(per_op.physical_device.bytes, 32.0 * 1024.0 / 3.0);
    }

    #[test]
    fn cache_ratios_from_the_layers_and_the_probes() {
        let window_report = report(
            WINDOW,
            &buffered_big_data_set(),
            &CacheFacts::default(),
            BLOCK,
        );
        // The guest read 40 KiB for 32 KiB asked: no hits, amplified 1.25x.
        assert_eq!(window_report.guest_cache.hit_ratio, Some(0.0));
        assert_eq!(window_report.guest_cache.read_amplification, Some(1.25));
        // The host device read 16 of the 40: 60 % served by the host cache.
        assert_eq!(window_report.host_cache.hit_ratio, Some(0.6));
        assert_eq!(window_report.host_cache.probed_read_bytes, 40 * KIB);
        assert_eq!(window_report.host_cache.probed_hit_ratio, Some(0.6));
        assert_eq!(window_report.double_cached, None);
    }

    #[test]
    fn a_guest_cache_hit_never_reaches_the_disk() {
        // Small data set, big guest: the re-read is served by the guest.
        let records = [
            read(Layer::Application, 1_100, 0, 16 * KIB),
            read(Layer::VirtualDisk, 1_101, 0, 16 * KIB),
            read(Layer::PhysicalDevice, 1_102, 0, 16 * KIB),
            read(Layer::Application, 1_200, 0, 16 * KIB),
            read(Layer::Application, 1_300, 0, 16 * KIB),
            read(Layer::Application, 1_400, 0, 16 * KIB),
        ];
        let window_report = report(WINDOW, &records, &CacheFacts::default(), BLOCK);
        assert_eq!(window_report.guest_cache.hit_ratio, Some(0.75));
        assert_eq!(window_report.host_cache.hit_ratio, Some(0.0));
        assert_eq!(window_report.host_cache.probed_hit_ratio, None);
        assert_eq!(
            window_report
                .per_application_operation
                .unwrap()
                .virtual_disk
                .bytes,
            4096.0
        );
    }

    #[test]
    fn counters_stand_in_for_application_records() {
        let application = LayerStats::from_counters(64 * KIB, 0, 4, 0);
        let records = [read(Layer::VirtualDisk, 1_100, 0, 16 * KIB)];
        let window_report =
            report_with_application(WINDOW, application, &records, &CacheFacts::default(), BLOCK);
        assert_eq!(window_report.guest_cache.hit_ratio, Some(0.75));
        assert_eq!(
            window_report.application.average_read_bytes,
            Some(16.0 * 1024.0)
        );
    }

    #[test]
    fn absent_layers_give_no_ratios() {
        let records = [read(Layer::VirtualDisk, 1_100, 0, 16 * KIB)];
        let physical = LayerStats::from_counters(4 * KIB, 0, 1, 0);
        let totals = LayerTotals {
            application: None,
            physical_device: Some(physical),
        };
        let window_report =
            report_from_layers(WINDOW, totals, &records, &CacheFacts::default(), BLOCK);
        assert_eq!(window_report.absent_layers, [Layer::Application]);
        assert_eq!(window_report.guest_cache.hit_ratio, None);
        assert_eq!(window_report.per_application_operation, None);
        assert_eq!(window_report.host_cache.hit_ratio, Some(0.75));
        assert_eq!(window_report.physical_device.read_requests, 1);
        // Without the physical layer, no host ratio from the layers.
        let window_report = report_from_layers(
            WINDOW,
            LayerTotals::default(),
            &records,
            &CacheFacts::default(),
            BLOCK,
        );
        assert_eq!(
            window_report.absent_layers,
            [Layer::Application, Layer::PhysicalDevice]
        );
        assert_eq!(window_report.host_cache.hit_ratio, None);
        let json = serde_json::to_string(&window_report).unwrap();
        let back: WindowReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, window_report);
    }

    #[test]
    fn an_empty_window_has_no_ratios() {
        let window_report = report(WINDOW, &[], &CacheFacts::default(), BLOCK);
        assert_eq!(window_report.per_application_operation, None);
        assert_eq!(window_report.guest_cache.hit_ratio, None);
        assert_eq!(window_report.host_cache.hit_ratio, None);
        assert_eq!(window_report.virtual_disk.average_request_bytes, None);
    }

    /// Virtual-disk reads of blocks 0..8, then block 0 again: newest first
    /// the distinct blocks are 0, 7, 6, 5, ...
    fn eight_blocks_and_a_reread() -> Vec<IoRecord> {
        let mut records: Vec<IoRecord> = (0..8)
            .map(|i| read(Layer::VirtualDisk, 1_100 + i, i * BLOCK, BLOCK))
            .collect();
        records.push(read(Layer::VirtualDisk, 1_200, 0, BLOCK));
        records
    }

    #[test]
    fn double_cached_with_a_measured_host_cache() {
        // The guest holds 4 blocks: the newest distinct, 0, 7, 6, 5. The
        // host holds 0..4: only block 0 is in both.
        let facts = CacheFacts {
            guest_cache_bytes: Some(4 * BLOCK),
            host_cache: Some(HostCacheView::ResidentBlocks((0..4).collect())),
        };
        let window_report = report(WINDOW, &eight_blocks_and_a_reread(), &facts, BLOCK);
        assert_eq!(
            window_report.double_cached,
            Some(DoubleCached {
                bytes: BLOCK,
                guest_blocks: 4,
                host_view: HostViewKind::Measured,
            })
        );
    }

    #[test]
    fn double_cached_with_an_assumed_lru_host_cache() {
        // Host cache of 2 blocks: its newest two are also the guest's.
        let facts = CacheFacts {
            guest_cache_bytes: Some(4 * BLOCK),
            host_cache: Some(HostCacheView::CapacityBytes(2 * BLOCK)),
        };
        let window_report = report(WINDOW, &eight_blocks_and_a_reread(), &facts, BLOCK);
        assert_eq!(window_report.double_cached.unwrap().bytes, 2 * BLOCK);
        // cache=none: nothing is cached twice.
        let facts = CacheFacts {
            host_cache: Some(HostCacheView::CapacityBytes(0)),
            ..facts
        };
        let window_report = report(WINDOW, &eight_blocks_and_a_reread(), &facts, BLOCK);
        assert_eq!(window_report.double_cached.unwrap().bytes, 0);
        // A guest cache bigger than the trace holds all 8 distinct blocks.
        let facts = CacheFacts {
            guest_cache_bytes: Some(100 * BLOCK),
            host_cache: Some(HostCacheView::CapacityBytes(100 * BLOCK)),
        };
        let window_report = report(WINDOW, &eight_blocks_and_a_reread(), &facts, BLOCK);
        assert_eq!(window_report.double_cached.unwrap().guest_blocks, 8);
        assert_eq!(window_report.double_cached.unwrap().bytes, 8 * BLOCK);
    }

    #[test]
    fn the_block_trace_is_in_time_order() {
        let records = [
            read(Layer::VirtualDisk, 1_300, 8 * KIB, 8 * KIB),
            read(Layer::Application, 1_100, 0, 4 * KIB),
            read(Layer::VirtualDisk, 1_100, 0, 4 * KIB),
            read(Layer::VirtualDisk, 3_000, 0, 4 * KIB),
        ];
        assert_eq!(virtual_disk_blocks(WINDOW, &records, BLOCK), [0, 2, 3]);
    }

    #[test]
    fn the_reread_trace_counts_reads_and_touches_writes() {
        let records = [
            read(Layer::VirtualDisk, 1_300, 4 * KIB, 4 * KIB),
            record(Layer::VirtualDisk, 1_200, Direction::Write, 0, 8 * KIB),
            read(Layer::Application, 1_100, 0, 4 * KIB),
        ];
        assert_eq!(
            virtual_disk_accesses(WINDOW, &records, BLOCK),
            [Access::Touch(0), Access::Touch(1), Access::Counted(1)]
        );
    }

    #[test]
    fn the_report_serializes_with_snake_case_names() {
        let window_report = report(
            WINDOW,
            &buffered_big_data_set(),
            &CacheFacts::default(),
            BLOCK,
        );
        let json = serde_json::to_value(&window_report).unwrap();
        assert_eq!(json["virtual_disk"]["read_requests"], 10);
        assert_eq!(json["host_cache"]["hit_ratio"], 0.6);
        assert!(json["double_cached"].is_null());
    }
}

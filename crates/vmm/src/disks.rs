//! The VM's disk images as the VMM handles them around snapshots and
//! migrations: made durable before the state leaves, handed over (locks
//! released) to a migration's destination, taken back when it refuses.
//!
//! A migration's destination opens its images unlocked at start-up
//! ([`Locking::Deferred`]) and locks them when the state arrives, after
//! the source has flushed and unlocked them: so a migration between two
//! hakoniwas on one host and one image works, and neither ever writes it
//! while the other may.

use std::sync::Arc;

use devices::virtio::block::device::DiskErrors;
use devices::virtio::block::error_policy::StopHandler;
use devices::virtio::block::{Block, CacheMode, DiskBackend, FileDisk, Locking};

/// One disk: its device name, its image and its held requests.
struct Disk {
    name: String,
    file: Arc<FileDisk>,
    errors: Arc<DiskErrors>,
}

impl Disk {
    fn unlock(&self) -> Result<(), devices::virtio::block::BlockError> {
        self.file.unlock_image()
    }
}

/// Every disk image of the VM.
#[derive(Clone, Default)]
pub struct Disks(Arc<Vec<Disk>>);

/// How `create_virtio_devices` opens images: locked now, or (a
/// migration's destination) at the switch-over.
pub fn locking(incoming: bool) -> Locking {
    if incoming {
        Locking::Deferred
    } else {
        Locking::Now
    }
}

impl Disks {
    /// The images of `blocks` (named as the devices are).
    pub fn of<'a>(blocks: impl IntoIterator<Item = &'a Block>) -> Disks {
        use devices::virtio::VirtioDevice;
        Disks(Arc::new(
            blocks
                .into_iter()
                .filter_map(|b| {
                    b.shared_disk().map(|file| Disk {
                        name: b.id().to_string(),
                        file,
                        errors: b.errors(),
                    })
                })
                .collect(),
        ))
    }

    /// Makes what the guest wrote durable: `fdatasync` of every image
    /// except `cache=unsafe` ones (whose point is not to). The devices
    /// must be paused (no request in flight). One line on failure.
    pub fn flush(&self) -> Result<(), String> {
        for d in self.0.iter() {
            if d.file.cache() == CacheMode::Unsafe || d.file.readonly() {
                continue;
            }
            d.file.flush().map_err(|e| {
                format!(
                    "disk {} ({}): fdatasync failed: {e}",
                    d.name,
                    d.file.path().display()
                )
            })?;
        }
        Ok(())
    }

    /// A migration's source at the switch-over: flushes every image, then
    /// lets go of its locks so the destination can take them. On failure
    /// the images it had released are locked again.
    pub fn hand_over(&self) -> Result<(), String> {
        self.flush()?;
        for (i, d) in self.0.iter().enumerate() {
            if let Err(e) = d.file.unlock_image() {
                let _ = self.take(&self.0[..i]);
                return Err(format!("disk {}: {e}", d.name));
            }
        }
        Ok(())
    }

    /// Locks every image not locked (a destination at the switch-over, a
    /// source whose destination refused): on failure those it took are
    /// released again, and the message names the disk and the holder.
    pub fn lock(&self) -> Result<(), String> {
        self.take(&self.0)
    }

    fn take(&self, disks: &[Disk]) -> Result<(), String> {
        let mut taken = Vec::new();
        for d in disks {
            if d.file.is_locked() {
                continue;
            }
            if let Err(e) = d.file.lock_image() {
                for t in taken {
                    let _ = Disk::unlock(t);
                }
                return Err(format!("disk {}: {e}", d.name));
            }
            taken.push(d);
        }
        Ok(())
    }

    /// Installs what pauses the VM when a disk's `werror`/`rerror=stop`
    /// holds a failed request.
    pub fn on_stop(&self, handler: StopHandler) {
        for d in self.0.iter() {
            d.errors.set_handler(handler.clone());
        }
    }

    /// Why a disk paused the VM, while one holds failed requests.
    pub fn stop_reason(&self) -> Option<String> {
        self.0
            .iter()
            .find_map(|d| d.errors.reason())
            .map(|r| r.to_string())
    }

    /// Refuses what cannot carry held requests (a snapshot, a migration):
    /// they were taken off the ring and not answered.
    pub fn refuse_if_held(&self, what: &str) -> Result<(), String> {
        match self.0.iter().find(|d| d.errors.held() > 0) {
            Some(d) => Err(format!(
                "{what} cannot be taken while disk {} holds {} failed requests (werror/rerror=stop): fix the cause and `ctl resume` first",
                d.name,
                d.errors.held()
            )),
            None => Ok(()),
        }
    }

    /// Runs every held request again (the VM resumes).
    pub fn retry(&self) {
        for d in self.0.iter() {
            d.errors.retry();
        }
    }

    /// Whether the VM has no disk image.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::virtio::block::BlockConfig;

    fn image(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "hakoniwa-disks-test-{}-{name}.img",
            std::process::id()
        ));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        path
    }

    #[test]
    fn a_destination_takes_the_images_the_source_hands_over() {
        let (a, b) = (image("a"), image("b"));
        let source_blocks = [
            Block::new(BlockConfig::new(&a)).unwrap(),
            Block::new(BlockConfig::new(&b)).unwrap(),
        ];
        let source = Disks::of(&source_blocks);
        // The destination opens the same images while the source runs.
        let dest_blocks = [
            Block::open(BlockConfig::new(&a), locking(true)).unwrap(),
            Block::open(BlockConfig::new(&b), locking(true)).unwrap(),
        ];
        let dest = Disks::of(&dest_blocks);
        let e = dest.lock().unwrap_err();
        assert!(e.starts_with("disk disk: disk image "), "{e}");
        assert!(e.contains("in use by another hakoniwa"), "{e}");
        // A refusal leaves nothing locked: the source still can.
        source.lock().unwrap();
        source.hand_over().unwrap();
        dest.lock().unwrap();
        // And a source whose destination took them cannot go on.
        assert!(source.lock().is_err());
        for p in [a, b] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_partial_lock_is_undone() {
        let (a, b) = (image("c"), image("d"));
        let dest_blocks = [
            Block::open(BlockConfig::new(&a), locking(true)).unwrap(),
            Block::open(BlockConfig::new(&b), locking(true)).unwrap(),
        ];
        let dest = Disks::of(&dest_blocks);
        let holder = Block::new(BlockConfig::new(&b)).unwrap();
        assert!(dest.lock().is_err());
        // The first image was released again when the second failed.
        let _other = Block::new(BlockConfig::new(&a)).unwrap();
        drop(holder);
        for p in [a, b] {
            let _ = std::fs::remove_file(p);
        }
    }
}

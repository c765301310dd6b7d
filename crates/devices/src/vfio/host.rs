//! The checks a device must pass on the host before it is opened, each
//! failure one line that says what to do: the PCI function exists, is bound
//! to vfio-pci, has an IOMMU group (no IOMMU, no group; checked first, as
//! vfio-pci cannot bind without one), and every other
//! member of its group is free for us. Reads sysfs only, under the paths
//! it is given, so the checks are tested over fake trees.

use std::path::{Path, PathBuf};

/// Drivers a group member may have without making the group unusable:
/// VFIO's own, the PCI stub, and the PCIe port driver of bridges (the
/// kernel's own viability rule).
const HARMLESS_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

/// A host PCI function that passed the checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDevice {
    /// The function's address (`0000:00:03.0`).
    pub address: String,
    /// Its sysfs directory, as given.
    pub sysfs: PathBuf,
    /// Its IOMMU group.
    pub group: u32,
}

/// Why a host device cannot be passed through.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostDeviceError {
    #[error(
        "{0}: no such PCI device (give its sysfs path, e.g. /sys/bus/pci/devices/0000:01:00.0)"
    )]
    NotFound(PathBuf),
    #[error("{address} is not bound to any driver; bind it to vfio-pci: echo vfio-pci > /sys/bus/pci/devices/{address}/driver_override; echo {address} > /sys/bus/pci/drivers_probe")]
    Unbound { address: String },
    #[error("{address} is bound to {driver}, not vfio-pci; rebind it: echo vfio-pci > /sys/bus/pci/devices/{address}/driver_override; echo {address} > /sys/bus/pci/devices/{address}/driver/unbind; echo {address} > /sys/bus/pci/drivers_probe")]
    WrongDriver { address: String, driver: String },
    #[error("{address} has no IOMMU group: the host has no IOMMU enabled (boot it with intel_iommu=on or amd_iommu=on)")]
    NoIommu { address: String },
    #[error("IOMMU group {group} of {address} also holds {other}, bound to {driver}: every device of the group must be bound to vfio-pci (or to no driver)")]
    GroupInUse {
        address: String,
        group: u32,
        other: String,
        driver: String,
    },
    #[error("{} does not exist: is the vfio-pci module loaded?", .0.display())]
    NoGroupNode(PathBuf),
}

/// The name of the driver `device` is bound to, if any.
fn driver_of(device: &Path) -> Option<String> {
    let link = std::fs::read_link(device.join("driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// Checks the function at `sysfs` (a `/sys/bus/pci/devices/...` directory)
/// and that VFIO's node for its group exists under `dev_vfio`.
pub fn check(sysfs: &Path, dev_vfio: &Path) -> Result<HostDevice, HostDeviceError> {
    let trimmed = PathBuf::from(sysfs.to_string_lossy().trim_end_matches('/'));
    if !trimmed.join("config").exists() {
        return Err(HostDeviceError::NotFound(sysfs.to_path_buf()));
    }
    // The address is the directory's own name, after following the link
    // /sys/bus/pci/devices/ADDR -> ../../../devices/pci0000:00/ADDR.
    let address = trimmed
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| HostDeviceError::NotFound(sysfs.to_path_buf()))?;
    // Without an IOMMU nothing can be bound to vfio-pci: say that first.
    let group = std::fs::read_link(trimmed.join("iommu_group"))
        .ok()
        .and_then(|link| link.file_name()?.to_str()?.parse::<u32>().ok())
        .ok_or_else(|| HostDeviceError::NoIommu {
            address: address.clone(),
        })?;
    match driver_of(&trimmed) {
        None => return Err(HostDeviceError::Unbound { address }),
        Some(driver) if driver != "vfio-pci" => {
            return Err(HostDeviceError::WrongDriver { address, driver })
        }
        Some(_) => {}
    }
    let mut members = std::fs::read_dir(trimmed.join("iommu_group").join("devices"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    members.sort();
    for member in members {
        let name = member
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == address {
            continue;
        }
        if let Some(driver) = driver_of(&member) {
            if !HARMLESS_DRIVERS.contains(&driver.as_str()) {
                return Err(HostDeviceError::GroupInUse {
                    address,
                    group,
                    other: name,
                    driver,
                });
            }
        }
    }
    let node = dev_vfio.join(group.to_string());
    if !node.exists() {
        return Err(HostDeviceError::NoGroupNode(node));
    }
    Ok(HostDevice {
        address,
        sysfs: trimmed,
        group,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake /sys with PCI functions and groups, and a fake /dev/vfio.
    struct Tree {
        root: PathBuf,
    }

    impl Tree {
        fn new(name: &str) -> Tree {
            let root =
                std::env::temp_dir().join(format!("hk-vfio-host-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("dev/vfio")).unwrap();
            std::fs::create_dir_all(root.join("drivers")).unwrap();
            Tree { root }
        }

        fn device(&self, address: &str, driver: Option<&str>, group: Option<u32>) -> PathBuf {
            let dir = self.root.join("devices").join(address);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config"), [0u8; 64]).unwrap();
            if let Some(driver) = driver {
                let d = self.root.join("drivers").join(driver);
                std::fs::create_dir_all(&d).unwrap();
                symlink(&d, dir.join("driver")).unwrap();
            }
            if let Some(group) = group {
                let g = self.root.join("groups").join(group.to_string());
                std::fs::create_dir_all(g.join("devices")).unwrap();
                symlink(&g, dir.join("iommu_group")).unwrap();
                symlink(&dir, g.join("devices").join(address)).unwrap();
                std::fs::write(self.root.join("dev/vfio").join(group.to_string()), "").unwrap();
            }
            dir
        }

        fn dev_vfio(&self) -> PathBuf {
            self.root.join("dev/vfio")
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn a_bound_device_alone_in_its_group_passes() {
        let t = Tree::new("ok");
        let dir = t.device("0000:00:03.0", Some("vfio-pci"), Some(7));
        let mut with_slash = dir.clone().into_os_string();
        with_slash.push("/");
        let d = check(Path::new(&with_slash), &t.dev_vfio()).unwrap();
        assert_eq!((d.address.as_str(), d.group), ("0000:00:03.0", 7));
    }

    #[test]
    fn each_refusal_names_what_to_do() {
        let t = Tree::new("refusals");
        let e = check(&t.root.join("devices/0000:09:00.0"), &t.dev_vfio()).unwrap_err();
        assert!(e.to_string().contains("no such PCI device"), "{e}");

        let no_iommu = t.device("0000:00:0a.0", Some("nvme"), None);
        let e = check(&no_iommu, &t.dev_vfio()).unwrap_err().to_string();
        assert!(
            e.contains("no IOMMU group"),
            "checked before the driver: {e}"
        );

        let unbound = t.device("0000:00:04.0", None, Some(4));
        let e = check(&unbound, &t.dev_vfio()).unwrap_err().to_string();
        assert!(
            e.contains("not bound to any driver") && e.contains("driver_override"),
            "{e}"
        );

        let nvme = t.device("0000:00:05.0", Some("nvme"), Some(5));
        let e = check(&nvme, &t.dev_vfio()).unwrap_err().to_string();
        assert!(
            e.contains("bound to nvme, not vfio-pci") && e.contains("unbind"),
            "{e}"
        );

        let no_group = t.device("0000:00:06.0", Some("vfio-pci"), None);
        let e = check(&no_group, &t.dev_vfio()).unwrap_err().to_string();
        assert!(
            e.contains("no IOMMU group") && e.contains("intel_iommu=on"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn a_group_shared_with_a_device_in_use_is_refused() {
        let t = Tree::new("group");
        let dir = t.device("0000:00:07.0", Some("vfio-pci"), Some(9));
        // Another function in group 9, bound to ahci.
        let other = t.root.join("devices/0000:00:07.1");
        std::fs::create_dir_all(&other).unwrap();
        let ahci = t.root.join("drivers/ahci");
        std::fs::create_dir_all(&ahci).unwrap();
        symlink(&ahci, other.join("driver")).unwrap();
        symlink(&other, t.root.join("groups/9/devices/0000:00:07.1")).unwrap();
        let e = check(&dir, &t.dev_vfio()).unwrap_err();
        assert_eq!(
            e,
            HostDeviceError::GroupInUse {
                address: "0000:00:07.0".into(),
                group: 9,
                other: "0000:00:07.1".into(),
                driver: "ahci".into()
            }
        );
        // Bound to pcieport (a bridge) or unbound: fine.
        std::fs::remove_file(other.join("driver")).unwrap();
        let port = t.root.join("drivers/pcieport");
        std::fs::create_dir_all(&port).unwrap();
        symlink(&port, other.join("driver")).unwrap();
        assert!(check(&dir, &t.dev_vfio()).is_ok());
    }

    #[test]
    fn a_missing_group_node_means_vfio_is_not_loaded() {
        let t = Tree::new("node");
        let dir = t.device("0000:00:08.0", Some("vfio-pci"), Some(3));
        std::fs::remove_file(t.dev_vfio().join("3")).unwrap();
        let e = check(&dir, &t.dev_vfio()).unwrap_err().to_string();
        assert!(
            e.contains("/3 does not exist") && e.contains("vfio-pci module"),
            "{e}"
        );
    }
}

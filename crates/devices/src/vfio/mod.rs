//! PCI passthrough through VFIO (seed 004): a host PCI function bound to
//! vfio-pci appears on the guest's PCI bus with its own identity, its BARs
//! mapped straight into the guest where VFIO allows, its MSI and MSI-X
//! interrupts delivered by KVM from the device's eventfds, and its DMA
//! going through the host IOMMU into guest RAM (mapped by the VMM).
//!
//! `host` checks the function on the host before anything is opened;
//! `config` decides what each configuration access means (pure);
//! `device` does it with VFIO and KVM. docs/passthrough.md says how to use
//! it and what is left out.

pub mod config;
pub mod device;
pub mod host;

use std::path::PathBuf;
use std::str::FromStr;

use crate::options::{Options, OptionsError};

pub use device::{GuestMapper, VfioPciDevice};
pub use host::{HostDevice, HostDeviceError};

/// `--device path=/sys/bus/pci/devices/DDDD:BB:DD.F[,id=NAME][,irq_affinity=on]`
/// (Cloud Hypervisor's syntax; `path=` may be left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassthroughConfig {
    /// The function's sysfs directory.
    pub path: PathBuf,
    /// The device's name in the API (default: `pt` and its index).
    pub id: Option<String>,
    /// Steer the host interrupts of the device to the VM's vCPU CPUs.
    pub irq_affinity: bool,
}

impl FromStr for PassthroughConfig {
    type Err = OptionsError;

    fn from_str(text: &str) -> Result<PassthroughConfig, OptionsError> {
        let mut options = Options::parse(text, Some("path"))?;
        let path = PathBuf::from(options.require("path")?);
        let id = options.take("id");
        if let Some(id) = &id {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(OptionsError::Invalid {
                    key: "id".into(),
                    value: id.clone(),
                    reason: "only printable ASCII without spaces".into(),
                });
            }
        }
        let irq_affinity = options.flag("irq_affinity", false)?;
        options.finish()?;
        Ok(PassthroughConfig {
            path,
            id,
            irq_affinity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_options_parse_as_cloud_hypervisor_writes_them() {
        let c: PassthroughConfig = "path=/sys/bus/pci/devices/0000:01:00.0/,id=nvme0"
            .parse()
            .unwrap();
        assert_eq!(c.path, PathBuf::from("/sys/bus/pci/devices/0000:01:00.0/"));
        assert_eq!(c.id.as_deref(), Some("nvme0"));
        assert!(!c.irq_affinity);
        let c: PassthroughConfig = "/sys/bus/pci/devices/0000:01:00.0,irq_affinity=on"
            .parse()
            .unwrap();
        assert!(c.irq_affinity);
        assert!("id=x".parse::<PassthroughConfig>().is_err());
        let e = "path=/x,speed=fast"
            .parse::<PassthroughConfig>()
            .unwrap_err();
        assert!(e.to_string().contains("unknown option 'speed'"), "{e}");
        assert!("path=/x,id=a b".parse::<PassthroughConfig>().is_err());
    }
}

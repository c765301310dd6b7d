//! Every switchable choice of hakoniwa's mechanisms, defined once: the
//! words, how they parse and print, their serde form, their help text.
//! `run`'s options, `ctl`'s flags and the control API all use these types,
//! so they take the same words and say the same one line for the same
//! mistake (`'fast' is not compare, dirtylog or wp`).
//!
//! - [`DirtyMethod`]: how the display finds changed framebuffer pages
//!   (seed 000);
//! - [`RefreshMode`]: what ends a display refresh period;
//! - [`Layout`]: how the framebuffer's pixels are laid out in memory;
//! - [`MigrationMode`]: how a VM moves (seed 003);
//! - [`SptPages`]: the shadow-page budget (seed 001);
//! - [`OnOff`]: a switch (`--async-pf`, device flags);
//! - [`SeccompMode`]: what a thread's seccomp filter does with a syscall
//!   outside its allow-list (`--seccomp`);
//! - [`LatencyHistogram`] and [`Boundaries`]: a disk's latency histograms
//!   and their bucket boundaries (`ctl counters`, `vm.latency-histogram`).

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A word that is none of a choice's words. One line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChoiceError {
    given: String,
    words: String,
}

impl fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}' is not {}", self.given, self.words)
    }
}

impl std::error::Error for ChoiceError {}

/// "a, b or c".
fn or_list(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Defines a choice among fixed words.
macro_rules! choice {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every choice, in the order the help lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word for this choice.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $word, )+
                }
            }

            /// The words, for help texts and errors: "a, b or c".
            pub fn words() -> String {
                or_list(&[$($word),+])
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $name {
            type Err = ChoiceError;
            fn from_str(text: &str) -> Result<$name, ChoiceError> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|c| c.name() == text)
                    .ok_or_else(|| ChoiceError {
                        given: text.to_string(),
                        words: $name::words(),
                    })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(de::Error::custom)
            }
        }
    };
}

mod latency;
pub use latency::{
    format_ns, Boundaries, BoundariesError, LatencyHistogram, DEFAULT_BOUNDARIES_NS, MAX_BOUNDARIES,
};

choice! {
    /// How the display finds the framebuffer pages the guest changed.
    pub enum DirtyMethod {
        /// Compare the whole framebuffer with a copy every period (the
        /// paper's baseline).
        Compare = "compare",
        /// KVM's dirty log of the framebuffer's slot (the paper's
        /// page-table lookup: dirty bits).
        DirtyLog = "dirtylog",
        /// userfaultfd write protection (the paper's write exceptions).
        Wp = "wp",
    }
}

choice! {
    /// What ends a display refresh period.
    pub enum RefreshMode {
        /// The adaptive timer only.
        Timer = "timer",
        /// The timer, but during an idle stretch (period above the base)
        /// the guest's first write to the framebuffer ends the wait at once.
        Event = "event",
    }
}

choice! {
    /// How the framebuffer's pixels lie in memory.
    pub enum Layout {
        /// Row after row, as every framebuffer driver expects.
        Linear = "linear",
        /// 32x32-pixel tiles of one page each (seed 000's page tiling).
        Tiled = "tiled",
    }
}

choice! {
    /// How the source moves a VM.
    pub enum MigrationMode {
        /// Copy RAM while the guest runs, again and again for what it
        /// dirtied, then stop it and copy the rest: the baseline.
        Precopy = "precopy",
        /// Stop at once, send CPU and device state, run on the destination
        /// and pull pages on demand (plus neighbours and a background push).
        Postcopy = "postcopy",
        /// Precopy rounds; postcopy once they stop converging.
        Hybrid = "hybrid",
    }
}

choice! {
    /// A switch.
    pub enum OnOff {
        On = "on",
        Off = "off",
    }
}

choice! {
    /// What the sandbox does with a syscall outside a thread's allow-list.
    pub enum SeccompMode {
        /// Stop the process with one line naming the thread and syscall.
        On = "on",
        /// The kernel logs the call and lets it proceed (finding allow-lists).
        Log = "log",
        /// No filters.
        Off = "off",
    }
}

impl From<OnOff> for bool {
    fn from(value: OnOff) -> bool {
        value == OnOff::On
    }
}

impl From<bool> for OnOff {
    fn from(on: bool) -> OnOff {
        if on {
            OnOff::On
        } else {
            OnOff::Off
        }
    }
}

/// A shadow-page budget as the user writes it: a number of 4 KiB pages,
/// or `auto` (follow the guest's page-table size). On the wire, a number
/// or the string `"auto"`. Range checks are the VMM's (they depend on the
/// guest's memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SptPages {
    /// A fixed budget of this many pages.
    Pages(u64),
    /// Follow the guest's page-table size.
    Auto,
}

impl SptPages {
    /// For help texts.
    pub fn words() -> String {
        "a number of 4 KiB pages or \"auto\"".into()
    }
}

impl FromStr for SptPages {
    type Err = ChoiceError;

    fn from_str(text: &str) -> Result<Self, ChoiceError> {
        let trimmed = text.trim();
        if trimmed.eq_ignore_ascii_case("auto") {
            return Ok(SptPages::Auto);
        }
        trimmed
            .parse::<u64>()
            .map(SptPages::Pages)
            .map_err(|_| ChoiceError {
                given: text.to_string(),
                words: SptPages::words(),
            })
    }
}

impl fmt::Display for SptPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SptPages::Pages(n) => write!(f, "{n}"),
            SptPages::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for SptPages {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SptPages::Pages(n) => s.serialize_u64(*n),
            SptPages::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for SptPages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SptPages, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Pages(u64),
            Word(String),
        }
        match Wire::deserialize(d)? {
            Wire::Pages(n) => Ok(SptPages::Pages(n)),
            Wire::Word(w) => w.parse().map_err(de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_choice_parses_prints_and_serializes_its_words() {
        for m in DirtyMethod::ALL {
            assert_eq!(m.name().parse::<DirtyMethod>(), Ok(*m));
            assert_eq!(m.to_string(), m.name());
            let json = serde_json::to_string(m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<DirtyMethod>(&json).unwrap(), *m);
        }
        assert_eq!("dirtylog".parse(), Ok(DirtyMethod::DirtyLog));
        assert_eq!("tiled".parse(), Ok(Layout::Tiled));
        assert_eq!("event".parse(), Ok(RefreshMode::Event));
        assert_eq!("hybrid".parse(), Ok(MigrationMode::Hybrid));
        assert!(bool::from("on".parse::<OnOff>().unwrap()));
    }

    #[test]
    fn a_wrong_word_is_the_same_line_everywhere() {
        let parsed = "fast".parse::<DirtyMethod>().unwrap_err().to_string();
        assert_eq!(parsed, "'fast' is not compare, dirtylog or wp");
        let wire = serde_json::from_str::<DirtyMethod>("\"fast\"")
            .unwrap_err()
            .to_string();
        assert!(wire.starts_with(&parsed), "{wire}");
        assert_eq!(
            "maybe".parse::<OnOff>().unwrap_err().to_string(),
            "'maybe' is not on or off"
        );
        assert_eq!(
            MigrationMode::words(),
            "precopy, postcopy or hybrid".to_string()
        );
        // Words are exact: the API and the command line agree on case.
        assert!("Precopy".parse::<MigrationMode>().is_err());
    }

    #[test]
    fn spt_pages_are_a_number_or_auto_on_the_wire() {
        assert_eq!("512".parse(), Ok(SptPages::Pages(512)));
        assert_eq!("AUTO".parse(), Ok(SptPages::Auto));
        assert_eq!(
            "lots".parse::<SptPages>().unwrap_err().to_string(),
            "'lots' is not a number of 4 KiB pages or \"auto\""
        );
        assert_eq!(serde_json::to_string(&SptPages::Auto).unwrap(), "\"auto\"");
        assert_eq!(serde_json::to_string(&SptPages::Pages(7)).unwrap(), "7");
        assert_eq!(
            serde_json::from_str::<SptPages>("512").unwrap(),
            SptPages::Pages(512)
        );
        assert!(serde_json::from_str::<SptPages>("-1").is_err());
        assert!(serde_json::from_str::<SptPages>("\"lots\"").is_err());
    }
}

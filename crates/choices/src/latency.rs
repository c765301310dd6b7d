//! The latency histograms a disk keeps and their bucket boundaries, as
//! `ctl counters`, the API and the docs name them (QEMU's
//! `block-latency-histogram-set`, docs/devices.md "Counters").

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::{or_list, ChoiceError};

choice! {
    /// One of a disk's latency histograms: a request kind (the time from
    /// taking the request off the ring to the host's completion, what
    /// QEMU's `rd_total_time_ns` measures), or a stage of every request.
    pub enum LatencyHistogram {
        Read = "read",
        Write = "write",
        Flush = "flush",
        /// DISCARD requests.
        Discard = "discard",
        /// WRITE_ZEROES requests.
        WriteZeroes = "write_zeroes",
        /// The queue thread's wake-up on the ioeventfd → the request off
        /// the available ring.
        KickToDequeue = "kick_to_dequeue",
        /// Off the ring → handed to the host (the I/O thread starts it).
        DequeueToSubmit = "dequeue_to_submit",
        /// Handed to the host → the host's completion.
        SubmitToComplete = "submit_to_complete",
        /// The host's completion → in the used ring, interrupt injected.
        CompleteToInterrupt = "complete_to_interrupt",
    }
}

/// Most boundaries a histogram takes (it then has one more bin).
pub const MAX_BOUNDARIES: usize = 64;

/// The boundaries every histogram starts with, in ns: 1-2-5 steps from
/// 1 µs to 1 s. A local NVMe read is ~10-100 µs, a page-cache hit a few
/// µs, an fdatasync of a busy file milliseconds to a second; the stages
/// of one request are often below 10 µs. Values past the last boundary
/// fall in the last bin.
pub const DEFAULT_BOUNDARIES_NS: [u64; 19] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
];

/// A histogram's bucket boundaries in ns: 1 to [`MAX_BOUNDARIES`] values,
/// each above the one before and above 0. Bin `i` counts the values `v`
/// with `boundaries[i-1] <= v < boundaries[i]` (bin 0 from 0, the last
/// bin to infinity), as QEMU's `BlockLatencyHistogramInfo`.
///
/// On the command line, a comma-separated list with units (`10us,1ms,2s`;
/// a bare number is ns) or `default`; on the wire, an array of ns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Boundaries(Vec<u64>);

/// Why a boundary list was refused. One line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundariesError(String);

impl fmt::Display for BoundariesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "boundaries: {}", self.0)
    }
}

impl std::error::Error for BoundariesError {}

impl Boundaries {
    /// Checks a list of ns values.
    pub fn new(ns: Vec<u64>) -> Result<Boundaries, BoundariesError> {
        let bad = |why: String| Err(BoundariesError(why));
        if ns.is_empty() {
            return bad("give at least one value".into());
        }
        if ns.len() > MAX_BOUNDARIES {
            return bad(format!("{} values, at most {MAX_BOUNDARIES}", ns.len()));
        }
        if ns[0] == 0 {
            return bad("0 is not a boundary (the first bin starts at 0)".into());
        }
        if let Some(w) = ns.windows(2).find(|w| w[1] <= w[0]) {
            return bad(format!(
                "{} follows {}: each value must be above the one before",
                format_ns(w[1]),
                format_ns(w[0])
            ));
        }
        Ok(Boundaries(ns))
    }

    /// [`DEFAULT_BOUNDARIES_NS`].
    pub fn default_set() -> Boundaries {
        Boundaries(DEFAULT_BOUNDARIES_NS.to_vec())
    }

    /// The values in ns.
    pub fn as_ns(&self) -> &[u64] {
        &self.0
    }

    /// The values in ns.
    pub fn into_ns(self) -> Vec<u64> {
        self.0
    }
}

impl Default for Boundaries {
    fn default() -> Boundaries {
        Boundaries::default_set()
    }
}

/// A duration in ns as the exact form with the largest unit that divides the
/// value (`10us`, `2ms`, `1s`, `1500ns`), so printing and parsing agree.
pub fn format_ns(ns: u64) -> String {
    for (unit, scale) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if ns >= scale && ns.is_multiple_of(scale) {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

/// One duration: a number with an optional unit (ns, us, ms, s).
fn parse_duration_ns(text: &str) -> Result<u64, BoundariesError> {
    let bad = || {
        BoundariesError(format!(
            "'{text}' is not a duration (a number with ns, us, ms or s)"
        ))
    };
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let scale = match unit {
        "" | "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(bad()),
    };
    number.checked_mul(scale).ok_or_else(bad)
}

impl FromStr for Boundaries {
    type Err = BoundariesError;

    fn from_str(text: &str) -> Result<Boundaries, BoundariesError> {
        let text = text.trim();
        if text == "default" {
            return Ok(Boundaries::default_set());
        }
        let values = text
            .split(',')
            .map(|v| parse_duration_ns(v.trim()))
            .collect::<Result<Vec<u64>, _>>()?;
        Boundaries::new(values)
    }
}

impl fmt::Display for Boundaries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<String> = self.0.iter().map(|&ns| format_ns(ns)).collect();
        f.write_str(&words.join(","))
    }
}

impl Serialize for Boundaries {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Boundaries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Boundaries, D::Error> {
        Boundaries::new(Vec::<u64>::deserialize(d)?).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_names_are_the_docs_words() {
        for h in LatencyHistogram::ALL {
            assert_eq!(h.name().parse::<LatencyHistogram>(), Ok(*h));
        }
        assert_eq!(
            "reads".parse::<LatencyHistogram>().unwrap_err().to_string(),
            format!("'reads' is not {}", LatencyHistogram::words())
        );
        assert!(LatencyHistogram::words().ends_with("or complete_to_interrupt"));
    }

    #[test]
    fn boundaries_parse_with_units_and_print_back() {
        let b: Boundaries = "1500, 10us,1ms ,2s".parse().unwrap();
        assert_eq!(b.as_ns(), &[1_500, 10_000, 1_000_000, 2_000_000_000]);
        let b: Boundaries = "10us,100us,1ms,2s".parse().unwrap();
        assert_eq!(b.as_ns(), &[10_000, 100_000, 1_000_000, 2_000_000_000]);
        assert_eq!(b.to_string(), "10us,100us,1ms,2s");
        assert_eq!(b.to_string().parse::<Boundaries>().unwrap(), b);
        assert_eq!("1500".parse::<Boundaries>().unwrap().to_string(), "1500ns");
        let d: Boundaries = "default".parse().unwrap();
        assert_eq!(d.as_ns(), &DEFAULT_BOUNDARIES_NS);
        assert_eq!(d.to_string().parse::<Boundaries>().unwrap(), d);
    }

    #[test]
    fn bad_lists_get_one_line_each() {
        let err = |text: &str| text.parse::<Boundaries>().unwrap_err().to_string();
        assert_eq!(
            err("1ms,500us"),
            "boundaries: 500us follows 1ms: each value must be above the one before"
        );
        assert_eq!(
            err("1ms,1ms"),
            "boundaries: 1ms follows 1ms: each value must be above the one before"
        );
        assert_eq!(
            err("10us,fast"),
            "boundaries: 'fast' is not a duration (a number with ns, us, ms or s)"
        );
        assert_eq!(
            err("5m"),
            "boundaries: '5m' is not a duration (a number with ns, us, ms or s)"
        );
        assert!(err("").contains("'' is not a duration"));
        assert!(err("1us,,2us").contains("'' is not a duration"));
        assert_eq!(
            err("0,1us"),
            "boundaries: 0 is not a boundary (the first bin starts at 0)"
        );
        assert!(err("-1").contains("'-1' is not a duration"));
        assert!(err("99999999999s").contains("is not a duration"));
        let many: Vec<String> = (1..=65).map(|i| i.to_string()).collect();
        assert_eq!(err(&many.join(",")), "boundaries: 65 values, at most 64");
        for e in ["1ms,500us", "x", "", "0"] {
            assert!(!err(e).contains('\n'));
        }
    }

    #[test]
    fn on_the_wire_boundaries_are_ns_and_checked() {
        let b = Boundaries::new(vec![1_000, 5_000]).unwrap();
        assert_eq!(serde_json::to_string(&b).unwrap(), "[1000,5000]");
        assert_eq!(
            serde_json::from_str::<Boundaries>("[1000,5000]").unwrap(),
            b
        );
        let e = serde_json::from_str::<Boundaries>("[5000,1000]").unwrap_err();
        assert!(
            e.to_string().starts_with("boundaries: 1us follows 5us"),
            "{e}"
        );
        assert!(serde_json::from_str::<Boundaries>("[]").is_err());
        assert!(serde_json::from_str::<Boundaries>("\"10us\"").is_err());
    }

    #[test]
    fn default_boundaries_are_valid_and_increasing() {
        assert_eq!(
            Boundaries::new(DEFAULT_BOUNDARIES_NS.to_vec()).unwrap(),
            Boundaries::default()
        );
    }
}

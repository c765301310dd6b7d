//! `key=value,key=value` device options, the Cloud Hypervisor convention
//! (`--disk path=disk.img,readonly=on`). One parser for every device, so
//! every device reports bad options the same way.

use std::collections::BTreeMap;

use crate::affinity::CpuSet;

/// Errors in a device's option string, naming the option.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("'{0}' is not key=value")]
    NotKeyValue(String),
    #[error("option '{0}' is given twice")]
    Duplicate(String),
    #[error("unknown option '{key}' (known: {known})")]
    Unknown { key: String, known: String },
    #[error("missing option '{0}'")]
    Missing(&'static str),
    #[error("option {key}={value}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
}

/// Parsed options; each accessor removes what it reads so that
/// [`Options::finish`] can reject anything left over.
#[derive(Debug)]
pub struct Options {
    values: BTreeMap<String, String>,
    known: Vec<&'static str>,
}

impl Options {
    /// Splits `text` at commas (not those inside `[...]`, so a value can be
    /// a list: `affinity=[0@[2,3],1@[4]]`) and each part at its first '='.
    /// A part without '=' is taken as the value of `bare_key`, if given (so
    /// `--disk disk.img` can mean `path=disk.img`).
    pub fn parse(text: &str, bare_key: Option<&'static str>) -> Result<Options, OptionsError> {
        let mut values = BTreeMap::new();
        for part in split_top_level(text).filter(|p| !p.is_empty()) {
            let (key, value) = match (part.split_once('='), bare_key) {
                (Some((k, v)), _) if !k.is_empty() => (k.to_string(), v.to_string()),
                (None, Some(bare)) if !values.contains_key(bare) => {
                    (bare.to_string(), part.to_string())
                }
                _ => return Err(OptionsError::NotKeyValue(part.to_string())),
            };
            if values.insert(key.clone(), value).is_some() {
                return Err(OptionsError::Duplicate(key));
            }
        }
        Ok(Options {
            values,
            known: Vec::new(),
        })
    }

    /// The string value of `key`, if present.
    pub fn take(&mut self, key: &'static str) -> Option<String> {
        self.known.push(key);
        self.values.remove(key)
    }

    /// The string value of `key`, which must be present.
    pub fn require(&mut self, key: &'static str) -> Result<String, OptionsError> {
        self.take(key).ok_or(OptionsError::Missing(key))
    }

    /// An `on`/`off` (also `true`/`false`) option; `default` when absent.
    pub fn flag(&mut self, key: &'static str, default: bool) -> Result<bool, OptionsError> {
        match self.take(key).as_deref() {
            None => Ok(default),
            // true/false are accepted as they always were; anything else
            // gets the switch's own line (choices::OnOff).
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => other
                .parse::<choices::OnOff>()
                .map(bool::from)
                .map_err(|e| invalid(key, other, &e.to_string())),
        }
    }

    /// A set of host CPUs, `[1]`, `[2-3,5]` (brackets optional); `None`
    /// when absent. Whether this host has them is checked when the device
    /// opens.
    pub fn cpu_set(&mut self, key: &'static str) -> Result<Option<CpuSet>, OptionsError> {
        let Some(text) = self.take(key) else {
            return Ok(None);
        };
        let inner = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(&text);
        CpuSet::parse(inner)
            .map(Some)
            .map_err(|reason| invalid(key, &text, &reason))
    }

    /// A value parsed with `FromStr`; `None` when absent.
    pub fn parsed<T: std::str::FromStr>(
        &mut self,
        key: &'static str,
    ) -> Result<Option<T>, OptionsError>
    where
        T::Err: std::fmt::Display,
    {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|e: T::Err| invalid(key, &v, &e.to_string())),
        }
    }

    /// One of `choices`; `default` when absent.
    pub fn choice(
        &mut self,
        key: &'static str,
        choices: &[&'static str],
        default: &'static str,
    ) -> Result<&'static str, OptionsError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => choices.iter().find(|c| **c == v).copied().ok_or_else(|| {
                invalid(key, &v, &format!("expected one of {}", choices.join(", ")))
            }),
        }
    }

    /// Fails on any option no accessor asked for.
    pub fn finish(self) -> Result<(), OptionsError> {
        match self.values.into_keys().next() {
            None => Ok(()),
            Some(key) => Err(OptionsError::Unknown {
                key,
                known: self.known.join(", "),
            }),
        }
    }
}

/// An `Invalid` error for `key=value`.
pub fn invalid(key: &str, value: &str, reason: &str) -> OptionsError {
    OptionsError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// The parts of `text` between commas that are not inside brackets.
pub fn split_top_level(text: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0usize;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_flags_and_choices() {
        let mut o = Options::parse("path=/a.img,readonly=on,cache=none", Some("path")).unwrap();
        assert_eq!(o.require("path").unwrap(), "/a.img");
        assert!(o.flag("readonly", false).unwrap());
        assert_eq!(
            o.choice("cache", &["writeback", "none", "unsafe"], "writeback")
                .unwrap(),
            "none"
        );
        assert_eq!(o.take("id"), None);
        o.finish().unwrap();
    }

    #[test]
    fn a_bare_value_is_the_bare_key() {
        let mut o = Options::parse("disk.img,readonly=off", Some("path")).unwrap();
        assert_eq!(o.require("path").unwrap(), "disk.img");
        assert!(!o.flag("readonly", true).unwrap());
    }

    #[test]
    fn mistakes_are_named() {
        assert_eq!(
            Options::parse("a=1,a=2", None).unwrap_err(),
            OptionsError::Duplicate("a".into())
        );
        assert_eq!(
            Options::parse("junk", None).unwrap_err(),
            OptionsError::NotKeyValue("junk".into())
        );
        let mut o = Options::parse("size=big,colour=red", None).unwrap();
        let err = o.parsed::<u64>("size").unwrap_err();
        assert!(err.to_string().contains("size=big"), "{err}");
        let err = o.finish().unwrap_err();
        assert!(err.to_string().contains("unknown option 'colour'"), "{err}");
        let mut o = Options::parse("cache=maybe", None).unwrap();
        assert!(o
            .choice("cache", &["none"], "none")
            .unwrap_err()
            .to_string()
            .contains("expected one of none"));
        let mut o = Options::parse("", None).unwrap();
        assert_eq!(
            o.require("path").unwrap_err(),
            OptionsError::Missing("path")
        );
    }

    #[test]
    fn commas_inside_brackets_stay_in_the_value() {
        let mut o = Options::parse("boot=2,affinity=[0@[2,3],1@[4]],x=y", None).unwrap();
        assert_eq!(o.take("affinity").as_deref(), Some("[0@[2,3],1@[4]]"));
        assert_eq!(o.take("boot").as_deref(), Some("2"));
        assert_eq!(
            split_top_level("a,[b,c],d").collect::<Vec<_>>(),
            ["a", "[b,c]", "d"]
        );
    }
}

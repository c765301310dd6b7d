//! The baseline: no detection at all; every page is a candidate and the
//! caller compares the whole framebuffer with its copy each period.

use super::{DirtyError, DirtyMethod, DirtyTracker, PageSet};

pub struct CompareTracker;

impl DirtyTracker for CompareTracker {
    fn method(&self) -> DirtyMethod {
        DirtyMethod::Compare
    }

    fn harvest(&mut self, out: &mut PageSet) -> Result<(), DirtyError> {
        out.insert_all();
        Ok(())
    }
}

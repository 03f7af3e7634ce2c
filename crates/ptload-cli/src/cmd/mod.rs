//! One module per command, each with its arguments and a `run` that
//! writes the command's output and returns its exit code.

use crate::args::GpuInfo;

pub(crate) mod completions;
pub(crate) mod convert;
pub(crate) mod demo;
pub(crate) mod diff;
pub(crate) mod inspect;
pub(crate) mod load;
pub(crate) mod man;
pub(crate) mod plan;
pub(crate) mod scan;

/// The machine's GPUs, asked only when a mapping needs them.
pub(crate) struct MachineGpus;

impl GpuInfo for MachineGpus {
    fn count(&self) -> usize {
        ptload_device::device_count()
    }

    fn totals(&self) -> Vec<(u32, u64)> {
        ptload_device::probe()
            .devices()
            .iter()
            .map(|g| (g.ordinal, g.total))
            .collect()
    }

    fn why_none(&self) -> String {
        ptload_device::probe().why_none()
    }
}

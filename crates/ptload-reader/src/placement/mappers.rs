//! The [`Mapper`] trait and the strategies that implement it.

use std::fmt;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::DType;

use super::location::{Device, Location, MapLocation};
use crate::glob::glob;

/// Everything known about one storage when it is placed.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct StorageRequest<'a> {
    /// Index into [`Checkpoint::storages`].
    pub index: usize,
    /// The storage key from the file.
    pub key: &'a str,
    /// The saved location.
    pub location: &'a Location,
    /// Element type of the saved storage.
    pub dtype: DType,
    /// Elements.
    pub numel: u64,
    /// Bytes.
    pub nbytes: u64,
    /// Names of every tensor that views this storage, in checkpoint order.
    pub tensors: &'a [&'a str],
}

/// Decides where each storage goes. Called once per storage (views of one
/// storage share its placement), in checkpoint order. `None` means "the
/// default": the saved location, as when torch's callable returns None.
///
/// Closures implement it:
///
/// ```
/// use ptload_reader::placement::{Device, Mapper, StorageRequest};
///
/// let mut embeddings_on_host = |s: &StorageRequest<'_>| {
///     s.tensors.iter().any(|n| n.contains("embed")).then_some(Device::Host)
/// };
/// # let _: &mut dyn Mapper = &mut embeddings_on_host;
/// ```
pub trait Mapper {
    /// The target of `storage`, or `None` for its saved location.
    fn map(&mut self, storage: &StorageRequest<'_>) -> Option<Device>;
}

impl<F: FnMut(&StorageRequest<'_>) -> Option<Device>> Mapper for F {
    fn map(&mut self, storage: &StorageRequest<'_>) -> Option<Device> {
        self(storage)
    }
}

/// torch's `map_location=None`: every storage stays where it was saved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keep;

impl Mapper for Keep {
    fn map(&mut self, _: &StorageRequest<'_>) -> Option<Device> {
        None
    }
}

/// torch's `map_location='cuda:0'` or `torch.device(...)`: everything to one device.
#[derive(Debug, Clone, Copy)]
pub struct To(pub Device);

impl Mapper for To {
    fn map(&mut self, _: &StorageRequest<'_>) -> Option<Device> {
        Some(self.0)
    }
}

/// torch's dict form (`{'cuda:1': 'cuda:0'}`): `get(tag, tag)`, so a
/// location not in the table stays where it was.
#[derive(Debug, Clone, Default)]
pub struct Table(pub Vec<(Location, Device)>);

impl Mapper for Table {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        self.0
            .iter()
            .find(|(from, _)| from == s.location)
            .map(|&(_, to)| to)
    }
}

/// Placement by tensor name, which torch's callable cannot see: the first
/// rule whose pattern matches a name of any tensor viewing the storage.
/// Patterns are globs: `*` matches any run of characters, `?` one.
#[derive(Debug, Clone, Default)]
pub struct ByName(pub Vec<(String, Device)>);

impl ByName {
    /// Rules as `PATTERN=DEVICE`, each string a comma-separated list of
    /// them (`encoder.*=cuda:0,*embed*=cpu`); devices as [`Device`] parses
    /// them.
    pub fn parse<S: AsRef<str>>(lists: &[S]) -> Result<ByName> {
        let mut rules = Vec::new();
        for list in lists {
            for rule in list.as_ref().split(',').filter(|r| !r.trim().is_empty()) {
                let bad = |what: String| Error::new(ErrorKind::InvalidSpec, what);
                let (pattern, target) = rule
                    .rsplit_once('=')
                    .filter(|(p, _)| !p.trim().is_empty())
                    .ok_or_else(|| {
                        bad(format!(
                            "rule {rule:?}: expected PATTERN=DEVICE (encoder.*=cuda:0)"
                        ))
                    })?;
                let device = target.parse::<Device>().map_err(|_| {
                    bad(format!(
                        "device {target:?}: expected cpu, cuda, cuda:N or meta"
                    ))
                })?;
                rules.push((pattern.trim().to_owned(), device));
            }
        }
        Ok(ByName(rules))
    }
}

impl Mapper for ByName {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        self.0
            .iter()
            .find(|(pattern, _)| s.tensors.iter().any(|name| glob(pattern, name)))
            .map(|&(_, d)| d)
    }
}

/// Storages of at least `threshold` bytes to `large`, the others to `small`.
#[derive(Debug, Clone, Copy)]
pub struct BySize {
    /// Bytes from which a storage is large.
    pub threshold: u64,
    /// Target of large storages.
    pub large: Device,
    /// Target of small storages.
    pub small: Device,
}

impl Mapper for BySize {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        Some(if s.nbytes >= self.threshold {
            self.large
        } else {
            self.small
        })
    }
}

/// Fill each device up to its budget, in order, then send the rest to the
/// host. A storage that does not fit in what is left of one device goes to
/// the next. Budgets given as a fraction of a device's memory are resolved
/// to bytes by the device crate.
#[derive(Debug, Clone)]
pub struct Budget {
    devices: Vec<(Device, u64)>,
}

impl Budget {
    /// `(device, bytes it may receive)`, in the order to fill them.
    pub fn new(devices: Vec<(Device, u64)>) -> Self {
        Budget { devices }
    }
}

impl Mapper for Budget {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        for (device, left) in &mut self.devices {
            if s.nbytes <= *left {
                *left -= s.nbytes;
                return Some(*device);
            }
        }
        Some(Device::Host)
    }
}

/// Spread storages over devices by bytes, in checkpoint order, so that
/// consecutive layers stay on one device (pipeline-style): device `i`
/// receives the storages whose running total falls in the `i`-th equal
/// share of the checkpoint's bytes.
#[derive(Debug, Clone)]
pub struct Balanced {
    devices: Vec<Device>,
    total: u64,
    seen: u64,
}

impl Balanced {
    /// Balance `ckpt`'s storages over `devices`.
    pub fn new(ckpt: &Checkpoint, devices: Vec<Device>) -> Self {
        let total = ckpt.storages().iter().map(|s| s.nbytes).sum();
        Balanced {
            devices,
            total,
            seen: 0,
        }
    }
}

impl Mapper for Balanced {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        let n = self.devices.len() as u64;
        if n == 0 {
            return None;
        }
        // The share holding this storage's midpoint: a storage straddling a
        // boundary goes where most of it falls.
        let middle = self.seen.saturating_add(s.nbytes / 2);
        self.seen = self.seen.saturating_add(s.nbytes);
        let share = if self.total == 0 {
            0
        } else {
            (u128::from(middle) * u128::from(n) / u128::from(self.total)).min(u128::from(n - 1))
        };
        self.devices
            .get(usize::try_from(share).unwrap_or(0))
            .copied()
    }
}

/// Composition: the first mapper that decides wins; `None` if none does.
#[derive(Default)]
pub struct First(pub Vec<Box<dyn Mapper>>);

impl fmt::Debug for First {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "First({} mappers)", self.0.len())
    }
}

impl Mapper for First {
    fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
        self.0.iter_mut().find_map(|m| m.map(s))
    }
}

impl MapLocation {
    /// The mapper for this spec; `auto` asks `gpu_count` how many GPUs exist.
    pub fn mapper(&self, gpu_count: impl FnOnce() -> usize) -> Box<dyn Mapper> {
        match self {
            MapLocation::Auto => Box::new(To(if gpu_count() > 0 {
                Device::Cuda(0)
            } else {
                Device::Host
            })),
            MapLocation::To(d) => Box::new(To(*d)),
            MapLocation::Table(t) => Box::new(Table(t.clone())),
        }
    }
}

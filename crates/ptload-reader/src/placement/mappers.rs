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
    /// Bytes the load copies from it: the whole storage, or in a plan of
    /// a selection ([`StateDict::device_map`](crate::state_dict::StateDict::device_map))
    /// what the selected tensors read of it (a rank's slices at their size).
    pub nbytes: u64,
    /// Names of every tensor that views this storage, in checkpoint order
    /// (in a plan of a selection, their selected names).
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
/// to bytes by the device crate, which knows the memory
/// (`ptload_device::Gpus::budget`), or by [`BudgetSpec::budget`] from
/// totals the caller has.
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

/// A size as budgets and shard sizes are written: `20GiB`, `512MB`,
/// `1.5GB`, `1000000` (decimal units K/M/G/T, binary KiB/MiB/GiB/TiB, case
/// ignored); `None` for anything else or a size past `u64`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1048576.0,
        "g" | "gb" => 1e9,
        "gib" => 1073741824.0,
        "t" | "tb" => 1e12,
        "tib" => 1099511627776.0,
        _ => return None,
    };
    let bytes = value * scale;
    (0.0..1.8e19).contains(&bytes).then_some(bytes as u64)
}

/// How much of each GPU a [`Budget`] may fill: a share of its memory or
/// a number of bytes. Parsed from `0.9`, `90%`, `20GiB`, `512MB` or a
/// byte count (a bare number from 2 to 999,999 is refused as a likely
/// mistake for GiB or a share).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetSpec {
    /// A share of each GPU's memory, in (0, 1].
    Share(f64),
    /// Bytes per GPU.
    Bytes(u64),
}

impl BudgetSpec {
    /// A budget filling each GPU `(ordinal, total bytes)`, in order, to
    /// this share or size.
    pub fn budget(self, totals: &[(u32, u64)]) -> Budget {
        let devices = totals
            .iter()
            .map(|&(i, total)| {
                let bytes = match self {
                    // Rounded down: never more than the share.
                    BudgetSpec::Share(f) => (total as f64 * f) as u64,
                    BudgetSpec::Bytes(b) => b,
                };
                (Device::Cuda(i), bytes)
            })
            .collect();
        Budget::new(devices)
    }
}

impl std::str::FromStr for BudgetSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<BudgetSpec> {
        let t = text.trim();
        let invalid = |why: String| Error::new(ErrorKind::InvalidSpec, why);
        if let Some(percent) = t.strip_suffix('%') {
            return match percent.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(BudgetSpec::Share(p / 100.0)),
                _ => Err(invalid(format!(
                    "{t:?}: a percentage must be in (0%, 100%]"
                ))),
            };
        }
        if let Ok(n) = t.parse::<u64>() {
            // A bare number above 1 is bytes; a small one is surely a
            // mistake for GiB or a share.
            if n > 1 && n < 1_000_000 {
                return Err(invalid(format!(
                    "{t:?}: a bare number is bytes per GPU; write the unit ({t}GiB) or a \
                     share of each GPU's memory (80%, 0.8)"
                )));
            }
        }
        if let Ok(f) = t.parse::<f64>() {
            if t.contains('.') || f <= 1.0 {
                return if f > 0.0 && f <= 1.0 {
                    Ok(BudgetSpec::Share(f))
                } else {
                    Err(invalid(format!("{t:?}: a fraction must be in (0, 1]")))
                };
            }
        }
        parse_size(t).map(BudgetSpec::Bytes).ok_or_else(|| {
            invalid(format!(
                "{t:?}: expected a share of each GPU's memory (0.9, 90%) or bytes (20GiB, \
                 512MB, 1000000)"
            ))
        })
    }
}

/// The placements a front end offers beside `map_location`, composed in
/// the order they decide (the CLI's `--place`, `--map-location`,
/// `--budget`, `--balance`; Python's `place=`, `budget=`, `balance=`):
/// name rules first, then the map location, the budget, the balance. A
/// storage none of them places keeps its saved location.
#[derive(Default)]
pub struct Choices {
    /// Tensor-name rules; the first match wins.
    pub by_name: ByName,
    /// The map location, for what no rule matched.
    pub map_location: Option<Box<dyn Mapper>>,
    /// GPUs filled in order up to their budget, then the host.
    pub budget: Option<Budget>,
    /// Storages spread by bytes over these devices.
    pub balance: Option<Vec<Device>>,
}

impl fmt::Debug for Choices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Choices")
            .field("by_name", &self.by_name)
            .field("map_location", &self.map_location.is_some())
            .field("budget", &self.budget)
            .field("balance", &self.balance)
            .finish()
    }
}

impl Choices {
    /// The one mapper these choices make for `ckpt` ([`Keep`] when none
    /// is given).
    pub fn mapper(self, ckpt: &Checkpoint) -> Box<dyn Mapper> {
        let mut chain: Vec<Box<dyn Mapper>> = Vec::new();
        if !self.by_name.0.is_empty() {
            chain.push(Box::new(self.by_name));
        }
        chain.extend(self.map_location);
        if let Some(budget) = self.budget {
            chain.push(Box::new(budget));
        }
        if let Some(devices) = self.balance {
            chain.push(Box::new(Balanced::new(ckpt, devices)));
        }
        match chain.len() {
            0 => Box::new(Keep),
            1 => chain.pop().unwrap_or_else(|| Box::new(Keep)),
            _ => Box::new(First(chain)),
        }
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

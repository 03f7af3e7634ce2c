//! Where storages go: the saved locations, the target devices, the
//! [`Mapper`] that decides, and the [`Plan`] that records its decisions.
//!
//! Planning is pure: it needs no GPU, so every strategy is tested on every
//! machine. The device crate executes a plan.

use std::fmt;
use std::str::FromStr;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::DType;

/// A storage's saved location tag, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Location {
    /// `cpu`
    Cpu,
    /// `cuda` (no index) or `cuda:N`
    Cuda(Option<u32>),
    /// `mps`
    Mps,
    /// `meta`
    Meta,
    /// `xpu` / `xpu:N`
    Xpu(Option<u32>),
    /// `hpu` / `hpu:N`
    Hpu(Option<u32>),
    /// `mtia` / `mtia:N`
    Mtia(Option<u32>),
    /// Any other backend tag (private backends), kept as text.
    Other(String),
}

fn indexed(rest: &str) -> Option<Option<u32>> {
    match rest {
        "" => Some(None),
        _ => rest.strip_prefix(':')?.parse().ok().map(Some),
    }
}

impl Location {
    /// Parse a saved tag. Never fails: unknown tags are kept as text, and
    /// only become an error if they must be restored with no mapping.
    pub fn parse(tag: &str) -> Location {
        let known = |prefix: &str| tag.strip_prefix(prefix).and_then(indexed);
        if tag == "cpu" {
            Location::Cpu
        } else if tag == "mps" {
            Location::Mps
        } else if tag == "meta" {
            Location::Meta
        } else if let Some(i) = known("cuda") {
            Location::Cuda(i)
        } else if let Some(i) = known("xpu") {
            Location::Xpu(i)
        } else if let Some(i) = known("hpu") {
            Location::Hpu(i)
        } else if let Some(i) = known("mtia") {
            Location::Mtia(i)
        } else {
            Location::Other(tag.to_owned())
        }
    }

    /// Where torch would restore this location with no `map_location`,
    /// among the targets ptload can place on.
    pub fn restore(&self) -> Result<Device> {
        match self {
            Location::Cpu => Ok(Device::Host),
            Location::Cuda(i) => Ok(Device::Cuda(i.unwrap_or(0))),
            Location::Meta => Ok(Device::Meta),
            Location::Other(tag) => Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "don't know how to restore data location of torch.storage.UntypedStorage \
                     (tagged with {tag})"
                ),
            )),
            other => Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "storages tagged {other} can only be placed on the host or a CUDA device by \
                     ptload: map them, e.g. --map-location {other}=cpu"
                ),
            )),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with = |f: &mut fmt::Formatter<'_>, name: &str, i: &Option<u32>| match i {
            Some(i) => write!(f, "{name}:{i}"),
            None => f.write_str(name),
        };
        match self {
            Location::Cpu => f.write_str("cpu"),
            Location::Cuda(i) => with(f, "cuda", i),
            Location::Mps => f.write_str("mps"),
            Location::Meta => f.write_str("meta"),
            Location::Xpu(i) => with(f, "xpu", i),
            Location::Hpu(i) => with(f, "hpu", i),
            Location::Mtia(i) => with(f, "mtia", i),
            Location::Other(tag) => f.write_str(tag),
        }
    }
}

/// Where a storage can be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory.
    Host,
    /// A CUDA device, by ordinal.
    Cuda(u32),
    /// Shape only: no data is read at all (as torch's `meta`).
    Meta,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Host => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Meta => f.write_str("meta"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// `cpu`, `cuda` (= `cuda:0`, as torch), `cuda:N`, `meta`.
    fn from_str(s: &str) -> Result<Device> {
        match Location::parse(s.trim()) {
            Location::Cpu => Ok(Device::Host),
            Location::Cuda(i) => Ok(Device::Cuda(i.unwrap_or(0))),
            Location::Meta => Ok(Device::Meta),
            _ => Err(Error::new(
                ErrorKind::Unsupported,
                format!("{s:?} is not a device ptload places on (cpu, cuda, cuda:N, meta)"),
            )),
        }
    }
}

/// What a map-location spec accepts, for messages.
pub const MAP_LOCATION_GRAMMAR: &str =
    "expected cpu, cuda, cuda:N, meta, auto, or FROM=TO[,FROM=TO...] \
                                         (e.g. cuda:1=cuda:0,cuda:3=cpu)";

/// A `map_location` written as text: torch's string and dict forms, plus
/// `auto` (the first GPU when there is one, else the host).
///
/// ```
/// use ptload_reader::placement::{Device, Location, MapLocation};
///
/// let spec: MapLocation = "cuda:1=cuda:0,cuda:3=cpu".parse()?;
/// assert_eq!(
///     spec,
///     MapLocation::Table(vec![
///         (Location::Cuda(Some(1)), Device::Cuda(0)),
///         (Location::Cuda(Some(3)), Device::Host),
///     ])
/// );
/// assert!("gpu".parse::<MapLocation>().is_err());
/// # Ok::<(), ptload_reader::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapLocation {
    /// `auto`.
    Auto,
    /// `cpu`, `cuda`, `cuda:N`, `meta`: everything to one device.
    To(Device),
    /// `FROM=TO,...`: saved locations to devices; others stay (torch's dict).
    Table(Vec<(Location, Device)>),
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

impl FromStr for MapLocation {
    type Err = Error;

    fn from_str(spec: &str) -> Result<MapLocation> {
        let invalid = |what: String| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!("{what}: {MAP_LOCATION_GRAMMAR}"),
            )
        };
        let spec = spec.trim();
        if spec == "auto" {
            return Ok(MapLocation::Auto);
        }
        if spec.is_empty() || !spec.contains('=') {
            return spec
                .parse::<Device>()
                .map(MapLocation::To)
                .map_err(|_| invalid(format!("{spec:?}")));
        }
        let mut table = Vec::new();
        for pair in spec.split(',') {
            let (from, to) = pair
                .split_once('=')
                .filter(|(f, t)| !f.trim().is_empty() && !t.trim().is_empty())
                .ok_or_else(|| invalid(format!("entry {pair:?}")))?;
            let to = to
                .trim()
                .parse::<Device>()
                .map_err(|_| invalid(format!("target {to:?} in {pair:?}")))?;
            table.push((Location::parse(from.trim()), to));
        }
        Ok(MapLocation::Table(table))
    }
}

/// Everything known about one storage when it is placed.
#[derive(Debug, Clone, Copy)]
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

/// Glob match: `*` any run (possibly empty), `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    glob_captures(pattern, text).is_some()
}

/// Glob match returning what each `*` matched, in order.
///
/// The pattern is split at `*` into literal parts (where `?` matches any one
/// character): the first must match at the start, the last at the end, and
/// each middle part at its leftmost place after the previous one; the
/// captures are what lies between. Leftmost placement finds a match whenever
/// one exists, without backtracking.
pub(crate) fn glob_captures<'t>(pattern: &str, text: &'t str) -> Option<Vec<&'t str>> {
    let t: Vec<(usize, char)> = text.char_indices().collect();
    let parts: Vec<Vec<char>> = pattern.split('*').map(|p| p.chars().collect()).collect();
    let matches_at = |part: &[char], at: usize| {
        part.len() <= t.len().saturating_sub(at)
            && part
                .iter()
                .zip(t.get(at..).unwrap_or_default())
                .all(|(&p, &(_, c))| p == '?' || p == c)
    };
    let byte = |i: usize| t.get(i).map_or(text.len(), |&(b, _)| b);
    let (first, rest) = parts.split_first()?;
    if rest.is_empty() {
        return (first.len() == t.len() && matches_at(first, 0)).then(Vec::new);
    }
    let (last, middle) = rest.split_last()?;
    let tail = t.len().checked_sub(last.len())?;
    if !matches_at(first, 0) || first.len() > tail || !matches_at(last, tail) {
        return None;
    }
    let mut captures = Vec::with_capacity(parts.len() - 1);
    let mut pos = first.len();
    for part in middle {
        let found = (pos..=tail.checked_sub(part.len())?).find(|&at| matches_at(part, at))?;
        captures.push(text.get(byte(pos)..byte(found)).unwrap_or_default());
        pos = found + part.len();
    }
    captures.push(text.get(byte(pos)..byte(tail)).unwrap_or_default());
    Some(captures)
}

/// One storage's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Index into [`Checkpoint::storages`].
    pub storage: usize,
    /// The saved location.
    pub location: Location,
    /// Where it goes.
    pub target: Device,
    /// Whether a mapper decided (`false`: the saved location was kept).
    pub mapped: bool,
}

/// The decision for every storage of a checkpoint: a value the device crate
/// executes, and that `inspect --json` reports as each tensor's `target`.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    placements: Vec<Placement>,
}

impl Plan {
    /// Ask `mapper` once per storage, in checkpoint order (the order in
    /// which tensors first view each storage), with every tensor name that
    /// views it. Locations left to their default must be restorable.
    pub fn new(ckpt: &Checkpoint, mapper: &mut dyn Mapper) -> Result<Plan> {
        let storages = ckpt.storages();
        let mut names: Vec<Vec<&str>> = vec![Vec::new(); storages.len()];
        let mut order: Vec<usize> = Vec::with_capacity(storages.len());
        for t in ckpt.tensors() {
            if let Some(i) = t.info().storage {
                if let Some(list) = names.get_mut(i) {
                    if list.is_empty() {
                        order.push(i);
                    }
                    list.push(t.name());
                }
            }
        }
        // Storages no named tensor views (kept for completeness) come last.
        order.extend((0..storages.len()).filter(|&i| names.get(i).is_some_and(Vec::is_empty)));
        let mut placements: Vec<Option<Placement>> = vec![None; storages.len()];
        for i in order {
            let Some(s) = storages.get(i) else { continue };
            let location = Location::parse(&s.location);
            let tensors = names.get(i).map(Vec::as_slice).unwrap_or_default();
            let request = StorageRequest {
                index: i,
                key: &s.key,
                location: &location,
                dtype: s.dtype,
                numel: s.numel,
                nbytes: s.nbytes,
                tensors,
            };
            let (target, mapped) = match mapper.map(&request) {
                Some(d) => (d, true),
                None => (
                    location.restore().map_err(|e| match tensors.first() {
                        Some(t) => e.for_tensor(t),
                        None => e,
                    })?,
                    false,
                ),
            };
            if let Some(slot) = placements.get_mut(i) {
                *slot = Some(Placement {
                    storage: i,
                    location,
                    target,
                    mapped,
                });
            }
        }
        Ok(Plan {
            placements: placements.into_iter().flatten().collect(),
        })
    }

    /// Every placement, by storage index.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// The target of storage `index`.
    pub fn target(&self, index: usize) -> Option<Device> {
        self.placements.get(index).map(|p| p.target)
    }

    /// The target of a tensor: its storage's, or `meta` for meta tensors.
    pub fn tensor_target(&self, tensor: &crate::checkpoint::TensorInfo) -> Device {
        tensor
            .storage
            .and_then(|i| self.target(i))
            .unwrap_or(Device::Meta)
    }

    /// Bytes and storages planned per device, in device order.
    pub fn per_device(&self, ckpt: &Checkpoint) -> Vec<(Device, u64, usize)> {
        let mut out: Vec<(Device, u64, usize)> = Vec::new();
        for p in &self.placements {
            let bytes = ckpt.storages().get(p.storage).map_or(0, |s| s.nbytes);
            match out.iter_mut().find(|(d, _, _)| *d == p.target) {
                Some(entry) => {
                    entry.1 += bytes;
                    entry.2 += 1;
                }
                None => out.push((p.target, bytes, 1)),
            }
        }
        out.sort_by_key(|&(d, _, _)| d);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_print() {
        for tag in [
            "cpu", "cuda", "cuda:3", "mps", "meta", "xpu:1", "hpu", "mtia:0", "npu:2", "cuda:x",
        ] {
            assert_eq!(Location::parse(tag).to_string(), tag);
        }
        assert_eq!(Location::parse("cuda:3"), Location::Cuda(Some(3)));
        assert_eq!(Location::parse("cuda:x"), Location::Other("cuda:x".into()));
        assert_eq!(
            Location::parse("cuda").restore().ok(),
            Some(Device::Cuda(0))
        );
        let e = Location::parse("npu:2").restore().expect_err("unknown");
        assert_eq!(
            e.message(),
            "don't know how to restore data location of torch.storage.UntypedStorage (tagged with npu:2)"
        );
        assert!(Location::Mps.restore().is_err());
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cuda".parse::<Device>().ok(), Some(Device::Cuda(0)));
        assert_eq!("cuda:2".parse::<Device>().ok(), Some(Device::Cuda(2)));
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Host));
        assert_eq!("meta".parse::<Device>().ok(), Some(Device::Meta));
        assert!("mps".parse::<Device>().is_err());
        assert!("cuda:-1".parse::<Device>().is_err());
    }

    #[test]
    fn globs() {
        assert!(glob("encoder.*", "encoder.layers.0.weight"));
        assert!(!glob("encoder.*", "decoder.layers.0.weight"));
        assert!(glob("*embed*", "model.embed_tokens.weight"));
        assert!(glob("layers.?.weight", "layers.3.weight"));
        assert!(!glob("layers.?.weight", "layers.12.weight"));
        assert!(glob("*", ""));
        assert!(!glob("a", ""));
        assert_eq!(
            glob_captures("encoder.*.weight", "encoder.layers.0.weight"),
            Some(vec!["layers.0"])
        );
        assert_eq!(glob_captures("*.*", "a.b.c"), Some(vec!["a", "b.c"]));
        assert_eq!(glob_captures("x*y*z", "x1y2z"), Some(vec!["1", "2"]));
        assert_eq!(glob_captures("pre*", "prefix"), Some(vec!["fix"]));
    }
}

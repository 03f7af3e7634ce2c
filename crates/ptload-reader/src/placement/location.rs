//! Saved location tags, target devices, and torch's `map_location` forms
//! written as text.

use std::fmt;
use std::str::FromStr;

use crate::advice::Hint;
use crate::error::{Error, ErrorKind, Result};

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
            )
            .with_hint(Hint::MapLocation {
                from: Some(tag.clone()),
                to: Some("cpu".to_owned()),
            })),
            other => Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "storages tagged {other} can only be placed on the host or a CUDA device by \
                     ptload"
                ),
            )
            .with_hint(Hint::MapLocation {
                from: Some(other.to_string()),
                to: Some("cpu".to_owned()),
            })),
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
        // Written by people: any case (`CPU`, `Cuda:1`).
        match Location::parse(&s.trim().to_ascii_lowercase()) {
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
        if spec.eq_ignore_ascii_case("auto") {
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

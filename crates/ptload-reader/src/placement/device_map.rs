//! The decisions of a [`Mapper`](super::Mapper) for a whole checkpoint.

use crate::checkpoint::Checkpoint;
use crate::error::Result;

use super::location::{Device, Location};
use super::mappers::{Mapper, StorageRequest};

/// One storage's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Placement {
    /// Index into [`Checkpoint::storages`].
    pub storage: usize,
    /// The saved location.
    pub location: Location,
    /// Where it goes.
    pub target: Device,
    /// Whether a mapper decided (`false`: the saved location was kept).
    pub mapped: bool,
    /// Bytes the load copies from the storage: all of it, or (a plan of a
    /// selection) what the selected tensors read of it, a rank's slices at
    /// their size; 0 for a storage no selected tensor reads (see
    /// [`StateDict::device_map`](crate::state_dict::StateDict::device_map)).
    pub nbytes: u64,
}

/// The decision for every storage of a checkpoint: a value the device crate
/// executes, and that `inspect --json` reports as each tensor's `target`.
#[derive(Debug, Clone, Default)]
pub struct DeviceMap {
    placements: Vec<Placement>,
}

impl DeviceMap {
    /// Ask `mapper` once per storage, in checkpoint order (the order in
    /// which tensors first view each storage), with every tensor name that
    /// views it. Locations left to their default must be restorable.
    pub fn new(ckpt: &Checkpoint, mapper: &mut dyn Mapper) -> Result<DeviceMap> {
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
        let nbytes: Vec<u64> = storages.iter().map(|s| s.nbytes).collect();
        DeviceMap::decide(ckpt, &order, &names, &nbytes, mapper)
    }

    /// Ask `mapper` about the storages `order` lists, each with its
    /// tensors' names and the bytes copied from it; every other storage
    /// stays where it was saved, unasked, with 0 bytes.
    pub(crate) fn decide(
        ckpt: &Checkpoint,
        order: &[usize],
        names: &[Vec<&str>],
        nbytes: &[u64],
        mapper: &mut dyn Mapper,
    ) -> Result<DeviceMap> {
        let storages = ckpt.storages();
        let mut placements: Vec<Option<Placement>> = vec![None; storages.len()];
        for &i in order {
            let Some(s) = storages.get(i) else { continue };
            let location = Location::parse(&s.location);
            // One list per storage: a storage no tensor views has none.
            let tensors: &[&str] = names.get(i).map_or(&[], Vec::as_slice);
            let copied = nbytes.get(i).copied().unwrap_or(s.nbytes);
            let request = StorageRequest {
                index: i,
                key: &s.key,
                location: &location,
                dtype: s.dtype,
                numel: s.numel,
                nbytes: copied,
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
                    nbytes: copied,
                });
            }
        }
        // Unasked storages keep their saved location (or the host when it
        // names no device this build knows), by index like the others.
        let placements = placements
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                p.unwrap_or_else(|| {
                    let location = storages
                        .get(i)
                        .map_or_else(|| Location::parse("cpu"), |s| Location::parse(&s.location));
                    Placement {
                        storage: i,
                        target: location.restore().unwrap_or(Device::Host),
                        location,
                        mapped: false,
                        nbytes: 0,
                    }
                })
            })
            .collect();
        Ok(DeviceMap { placements })
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
    pub fn tensor_target(&self, tensor: &crate::torch::tensor::TensorInfo) -> Device {
        tensor
            .storage
            .and_then(|i| self.target(i))
            .unwrap_or(Device::Meta)
    }

    /// Bytes and storages planned per device, in device order.
    pub fn per_device(&self, ckpt: &Checkpoint) -> Vec<(Device, u64, usize)> {
        let mut out: Vec<(Device, u64, usize)> = Vec::new();
        let whole = |p: &Placement| ckpt.storages().get(p.storage).map_or(0, |s| s.nbytes);
        // A storage nothing selected reads is not part of the load.
        for p in self
            .placements
            .iter()
            .filter(|p| p.nbytes > 0 || whole(p) == 0)
        {
            let bytes = p.nbytes;
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

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
        let mut placements: Vec<Option<Placement>> = vec![None; storages.len()];
        for i in order {
            let Some(s) = storages.get(i) else { continue };
            let location = Location::parse(&s.location);
            // One list per storage: a storage no tensor views has none.
            let tensors: &[&str] = names.get(i).map_or(&[], Vec::as_slice);
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
        Ok(DeviceMap {
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
    pub fn tensor_target(&self, tensor: &crate::torch::tensor::TensorInfo) -> Device {
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

//! Storages named by persistent ids: the forms each layout writes, legacy
//! views, and the dtype a storage class stands for.

use super::*;

/// A storage named by a persistent id, before its bytes are located.
#[derive(Debug, Clone)]
pub(crate) struct PendingStorage {
    pub(crate) key: String,
    /// The zip record holding its bytes (zip layouts only).
    pub(crate) record: Option<String>,
    pub(crate) dtype: DType,
    pub(crate) numel: u64,
    pub(crate) location: String,
    /// Legacy storages that are views of another storage.
    pub(crate) view: Option<StorageView>,
    /// The quantized element type its class names (`qint8` for
    /// `QInt8Storage`...), which its integer dtype alone does not tell.
    pub(crate) quantized: Option<&'static str>,
}

/// The quantized element type a storage class stands for.
fn quantized_kind(class: &str) -> Option<&'static str> {
    Some(match class {
        "QInt8Storage" => "qint8",
        "QUInt8Storage" => "quint8",
        "QInt32Storage" => "qint32",
        "QUInt4x2Storage" => "quint4x2",
        "QUInt2x4Storage" => "quint2x4",
        _ => return None,
    })
}

/// A legacy storage view: `numel` elements from `elem_offset` in `root`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StorageView {
    pub(crate) root: usize,
    pub(crate) elem_offset: u64,
}

impl TorchInterp<'_> {
    pub(crate) fn storage_by_key(&self, key: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(key);
        let table = &self.namespaces.get(self.namespace)?.1;
        table
            .find(hash, |&i| {
                self.storages.get(i).is_some_and(|s| s.key == key)
            })
            .copied()
    }

    /// Room for `n` more storages, in the list and in the table of the
    /// current namespace.
    pub(crate) fn reserve_storages(&mut self, n: usize) {
        self.storages.reserve(n);
        let (storages, hasher) = (&self.storages, &self.hasher);
        if let Some((_, table)) = self.namespaces.get_mut(self.namespace) {
            table.reserve(n, |&i| {
                storages
                    .get(i)
                    .map_or(0, |s| hasher.hash_one(s.key.as_str()))
            });
        }
    }

    pub(super) fn new_storage(&mut self, storage: PendingStorage) -> usize {
        let id = self.storages.len();
        let hash = self.hasher.hash_one(storage.key.as_str());
        self.storages.push(storage);
        let (storages, hasher) = (&self.storages, &self.hasher);
        if let Some((_, table)) = self.namespaces.get_mut(self.namespace) {
            table.insert_unique(hash, id, |&i| {
                storages
                    .get(i)
                    .map_or(0, |s| hasher.hash_one(s.key.as_str()))
            });
        }
        id
    }

    /// The storage `v` references, and the dtype the reference types it as.
    pub(super) fn storage_of(&self, heap: &Heap, v: Value) -> Result<(usize, DType)> {
        match heap.torch(v) {
            Some(TorchObj::Storage { index, dtype }) => Ok((*index, *dtype)),
            _ => Err(err(format!(
                "expected a storage, found {}",
                describe(heap, v)
            ))),
        }
    }

    pub(super) fn dtype_of(&self, heap: &Heap, v: Value) -> Result<DType> {
        match known(heap, v) {
            Some((Known::Dtype(d), _)) => Ok(d),
            Some((_, g)) => Err(Error::new(
                ErrorKind::Unsupported,
                format!("unsupported dtype torch.{}", g.name),
            )),
            None => Err(err(format!(
                "expected a dtype, found {}",
                describe(heap, v)
            ))),
        }
    }

    pub(super) fn load_persistent(&mut self, heap: &mut Heap, pid: Value) -> Result<Value> {
        let items = heap.tuple(pid).ok_or_else(|| {
            err(format!(
                "persistent id must be a tuple, found {}",
                describe(heap, pid)
            ))
        })?;
        let items = copy_args(items, "persistent id")?;
        let kind = heap.text(get(&items, 0)).ok_or_else(|| {
            err(format!(
                "persistent id kind is a {}, not a str",
                describe(heap, get(&items, 0))
            ))
        })?;
        if kind == "module" && self.storage_dir.is_none() {
            // Legacy files record module source alongside the class: the class.
            return Ok(get(&items, 1));
        }
        if kind != "storage" {
            return Err(err(format!("unsupported persistent id kind {kind:?}")));
        }
        // Legacy files add view metadata as a sixth item; TorchScript
        // archives of torch 1.3/1.4 add a sixth `None`, which torch's
        // reader ignores.
        let legacy = self.storage_dir.is_none();
        let sixth_ok = legacy || get(&items, 5) == Value::None;
        if !(items.len() == 5 || items.len() == 6 && sixth_ok) {
            return Err(err(format!(
                "storage persistent id has {} items",
                items.len()
            )));
        }
        let quantized = known(heap, get(&items, 1)).and_then(|(_, g)| quantized_kind(&g.name));
        let dtype = match known(heap, get(&items, 1)) {
            Some((Known::StorageClass(d), _)) => d,
            Some((_, g)) => {
                return Err(err(format!("unknown storage type {}.{}", g.module, g.name)))
            }
            None => return Err(err("storage type must be a global")),
        };
        let int_key;
        let key: &str = match get(&items, 2) {
            Value::Int(i) => {
                int_key = i.to_string();
                &int_key
            }
            v => heap
                .text(v)
                .ok_or_else(|| err("storage key must be a str"))?,
        };
        let location = heap
            .text(get(&items, 3))
            .ok_or_else(|| err("storage location must be a str"))?;
        // Looking the key up hashes it; memo references can repeat long ones.
        heap.charge_work((key.len() + location.len()) as u64)?;
        let numel = u64::try_from(int(heap, get(&items, 4), "storage size")?)
            .map_err(|_| err("storage size is negative"))?;
        // The first reference to a key decides its type, as in torch.
        let id = match self.storage_by_key(key) {
            Some(id) => id,
            None => {
                let storage = PendingStorage {
                    key: key.to_owned(),
                    record: self.storage_dir.as_ref().map(|dir| {
                        let mut record = String::with_capacity(dir.len() + key.len());
                        record.push_str(dir);
                        record.push_str(key);
                        record
                    }),
                    dtype,
                    numel,
                    location: location.to_owned(),
                    view: None,
                    quantized,
                };
                self.new_storage(storage)
            }
        };
        let view = get(&items, 5);
        let id = if let Some(meta) = heap.tuple(view).map(<[Value]>::to_vec) {
            heap.charge_work(meta.len() as u64)?;
            arity(&meta, "storage view metadata", &[3])?;
            let view_key = heap
                .text(get(&meta, 0))
                .ok_or_else(|| err("view key must be a str"))?
                .to_owned();
            let elem_offset = u64::try_from(int(heap, get(&meta, 1), "view offset")?)
                .map_err(|_| err("view offset is negative"))?;
            let view_numel = u64::try_from(int(heap, get(&meta, 2), "view size")?)
                .map_err(|_| err("view size is negative"))?;
            match self.storage_by_key(&view_key) {
                Some(v) => v,
                None => {
                    let location = self
                        .storages
                        .get(id)
                        .map(|s| s.location.clone())
                        .ok_or_else(|| err("view of a storage that was never made"))?;
                    self.new_storage(PendingStorage {
                        key: view_key,
                        record: None,
                        dtype,
                        numel: view_numel,
                        location,
                        view: Some(StorageView {
                            root: id,
                            elem_offset,
                        }),
                        quantized,
                    })
                }
            }
        } else {
            id
        };
        heap.alloc_torch(TorchObj::Storage { index: id, dtype })
    }
}

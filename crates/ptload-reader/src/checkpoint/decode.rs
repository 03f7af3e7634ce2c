//! From a source to a [`Checkpoint`]: the scan beside the decode, the
//! pickles run, the walk that names tensors, and checkpoints put together
//! from parts (distributed checkpoints) or read from safetensors.

use super::*;
use crate::container::zip::Headers;
use crate::torch::names::Walked;
use crate::torch::plain::KeptPlain;

/// A tensor the walk named, checked against its storage: a rebuilt
/// tensor, or a storage pickled on its own.
fn walked_tensor(
    heap: &Heap,
    name: String,
    value: Value,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<TensorInfo> {
    match heap.torch(value) {
        Some(TorchObj::Tensor(meta)) => tensor_info(heap, name, meta, storages, limits),
        Some(TorchObj::Storage { index, dtype }) => bare_storage(name, *index, *dtype, storages),
        _ => Err(Error::new(
            ErrorKind::Tensor,
            format!(
                "'{name}' is a tensor component but holds a {}",
                crate::torch::describe(heap, value)
            ),
        )),
    }
}

/// Whether `source` is worth scanning on a thread of its own while it is
/// decoded: an archive of many records (each a storage, so a pickle of
/// many tensors, whose scan takes milliseconds). A legacy file, a
/// safetensors file and a small archive are scanned on the caller's.
#[cfg(feature = "scan")]
fn worth_a_thread(source: &Source) -> bool {
    /// Records from which a torch archive's pickle takes longer to scan
    /// than a thread to start (measured: 20,000 records scan in about
    /// 30 ms, 150 in a fraction of the 0.3 ms a thread costs).
    const MANY_RECORDS: u16 = 1_000;
    crate::container::zip::records_hint(source.bytes()).is_some_and(|n| n >= MANY_RECORDS)
}

/// The scanner's verdict (`report`): an error of kind `Refused` naming
/// the worst finding when it is at `level` or above.
#[cfg(feature = "scan")]
fn refuse_at(report: &crate::scan::ScanReport, level: crate::scan::Level) -> Result<()> {
    let found = report.level();
    if found < level {
        return Ok(());
    }
    let worst = report
        .pickles
        .iter()
        .flat_map(|p| p.globals.iter().map(move |g| (p, g)))
        .filter(|(_, g)| g.level() == found)
        .map(|(p, g)| {
            format!(
                "{} {} ({}) in {}",
                g.path(),
                g.usage.name(),
                g.class.label(),
                p.source
            )
        })
        .next()
        .or_else(|| {
            report
                .effects
                .first()
                .map(|e| format!("{} ({} at offset {})", e.what, e.record, e.offset))
        })
        .or_else(|| {
            report
                .ambiguities
                .first()
                .map(|a| format!("{} ({} at offset {})", a.what, a.record, a.offset))
        })
        .unwrap_or_else(|| "the file's structure".to_owned());
    Err(Error::new(
        ErrorKind::Refused,
        format!(
            "scan: {worst}: the file is at {}, and files at {} or above are refused",
            found.name(),
            level.name()
        ),
    ))
}

/// Torch names the first global it refuses; a user fixing a file one
/// global per run needs the whole list. Read the file again without the
/// policy (nothing is ever run either way) and name every global the
/// policy would refuse, when there is more than one.
fn every_refusal(first: Error, source: &Source, opts: &OpenOptions) -> Error {
    let mut lenient = opts.clone();
    lenient.policy = Policy::Default;
    let Ok(ckpt) = Checkpoint::decode(source.clone(), &lenient) else {
        return first;
    };
    let refused = ckpt.refused_globals(&opts.allowed_globals);
    if refused.len() < 2 {
        return first;
    }
    let note = format!(
        "The file names {} globals outside the allowlist: {}",
        refused.len(),
        refused.join(", ")
    );
    first.with_note(note, Some(Hint::AllowGlobals(refused)))
}

/// The decoded storages as the checkpoint describes them, and the
/// deflated records whose bytes are inflated on first use.
fn storage_infos(
    pending: Vec<PendingStorage>,
    bytes: Vec<StorageBytes>,
) -> (Vec<StorageInfo>, Vec<Inflated>) {
    let mut inflated = Vec::new();
    let storages = pending
        .into_iter()
        .zip(bytes)
        .map(|(p, bytes)| {
            let nbytes = p.numel.saturating_mul(p.dtype.size() as u64);
            let data = match bytes {
                StorageBytes::File(offset) => StorageData::File(offset),
                StorageBytes::Deflated(record) => {
                    inflated.push(Inflated {
                        record,
                        bytes: std::sync::OnceLock::new(),
                    });
                    StorageData::Deflated(inflated.len() - 1)
                }
            };
            StorageInfo {
                file_offset: match data {
                    StorageData::File(o) => Some(o),
                    StorageData::Owned(_) | StorageData::Deflated(_) | StorageData::Lazy(_) => None,
                },
                key: p.key,
                location: p.location,
                dtype: p.dtype,
                numel: p.numel,
                nbytes,
                record: p.record,
                data,
                quantized: p.quantized,
            }
        })
        .collect();
    (storages, inflated)
}

/// The source's pickles run onto `heap`, read as the container they are
/// found in; with them, the globals a pickle before a zip archive names
/// (bytes torch's reader skips, and scan reports).
fn decode_pickles(
    source: &Source,
    headers: Option<Headers<'_>>,
    kept: Option<&KeptPlain>,
    detected: Detected,
    opts: &OpenOptions,
    heap: &mut Heap,
    interp: &mut TorchInterp<'_>,
) -> Result<(Decoded, Vec<GlobalRef>)> {
    let data = source.view();
    let mut vm = Vm::new(&opts.limits, opts.encoding);
    vm.cancel = opts.cancel.clone();
    let mut leading = Vec::new();
    let decoded = match detected {
        Detected::Zip => {
            if data.up_to(0, 4) != b"PK\x03\x04" {
                let all = data.get(0..data.len()).ok_or_else(|| {
                    Error::new(ErrorKind::Zip, "bytes before the archive not fetched yet")
                })?;
                leading = leading_globals(all, opts)?;
            }
            decode_zip(
                data,
                headers.unwrap_or_else(|| source.file().map_or(Headers::Map, Headers::File)),
                opts.assumed_byte_order,
                &opts.limits,
                heap,
                interp,
                &mut vm,
                !opts.objects && !opts.general_only,
                kept,
            )?
        }
        Detected::Legacy => decode_legacy(data, heap, interp, &mut vm)?,
        // Read by `Checkpoint::from_safetensors` before any pickle.
        Detected::Safetensors => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "a safetensors file holds no pickle",
            ))
        }
    };
    Ok((decoded, leading))
}

/// More tensors than the limit allows: an error.
fn check_tensor_count(count: usize, limits: &Limits) -> Result<()> {
    if count > limits.max_tensors {
        return Err(Error::limit_needing(
            "max_tensors",
            limits.max_tensors as u64,
            count as u64,
        ));
    }
    Ok(())
}

/// For the object graph: the first walked entry of each heap value, by
/// object id (`NOT_WALKED` where none); empty without the graph.
struct FirstWalked(Vec<u32>);

impl FirstWalked {
    const NOT_WALKED: u32 = u32::MAX;

    fn of(heap: &Heap, tensors: &[(String, Value)], objects: bool) -> Self {
        let mut walked_at: Vec<u32> = Vec::new();
        if objects {
            walked_at.resize(heap.len(), Self::NOT_WALKED);
            for (i, (_, v)) in tensors.iter().enumerate() {
                if let (Value::Obj(id), Ok(i)) = (v, u32::try_from(i)) {
                    match walked_at.get_mut(*id as usize) {
                        Some(slot) if *slot == Self::NOT_WALKED => *slot = i,
                        _ => {}
                    }
                }
            }
        }
        FirstWalked(walked_at)
    }

    /// The walked entry of `v`, if the walk reached it.
    fn entry(&self, v: Value) -> Option<usize> {
        match v {
            Value::Obj(id) => self
                .0
                .get(id as usize)
                .filter(|&&i| i != Self::NOT_WALKED)
                .map(|&i| i as usize),
            _ => None,
        }
    }
}

/// The DTensors among a file's tensors: each one's index and its layout.
type DTensors = Vec<(u32, DTensorSpec)>;

/// Each tensor the walk named, checked against its storage, and the
/// DTensors among them by index.
fn walked_tensors(
    heap: &Heap,
    walked: Vec<(String, Value)>,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<(Vec<TensorInfo>, DTensors)> {
    let mut tensors = Vec::with_capacity(walked.len());
    let mut dtensors = Vec::new();
    for (name, value) in walked {
        // Indices must stay those of `by_name`: nothing is skipped.
        if let Some(TorchObj::Tensor(meta)) = heap.torch(value) {
            if let Some(spec) = &meta.dtensor {
                let at = u32::try_from(tensors.len())
                    .map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
                dtensors.push((at, (**spec).clone()));
            }
        }
        tensors.push(walked_tensor(heap, name, value, storages, limits)?);
    }
    Ok((tensors, dtensors))
}

/// The object graph under `root`: a tensor the walk reached is copied from
/// its entry, any other described as `<node N>`.
fn object_graph(
    heap: &Heap,
    root: Value,
    first_walked: &FirstWalked,
    tensors: &[TensorInfo],
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<Objects> {
    let walked = |v: Value| first_walked.entry(v).and_then(|i| tensors.get(i));
    let mut make = |v: Value, node: usize| match (walked(v), heap.torch(v)) {
        (Some(t), _) => Ok(t.clone()),
        (None, Some(TorchObj::Tensor(meta))) => {
            tensor_info(heap, format!("<node {node}>"), meta, storages, limits)
        }
        _ => Err(Error::new(ErrorKind::Tensor, "not a tensor")),
    };
    crate::object::build(heap, root, limits, tensors.len(), &mut make)
}

/// The warning for a file holding DTensors: what each of its entries is.
fn dtensor_warning(dtensors: &[(u32, DTensorSpec)]) -> Option<Warning> {
    let (_, spec) = dtensors.first()?;
    Some(Warning::LocalParts {
        count: dtensors.len(),
        rank: spec.rank,
        coordinate: spec.coordinate.clone(),
        mesh: spec.mesh.clone(),
    })
}

impl Checkpoint {
    /// Decode `source`; scanned too when `opts` asks (its report kept, and
    /// a file at `refuse_at` or above refused): bytes at hand are scanned
    /// on a second thread while they are decoded, a file read by ranges
    /// first when it may be refused.
    #[cfg(feature = "scan")]
    pub(super) fn scan_and_decode(source: &Source, opts: &OpenOptions) -> Result<Checkpoint> {
        // Scanned on this thread, then decoded: the local headers the scan
        // reads are kept for the decode, which reads the same ones.
        // So is its plain read of `data.pkl`.
        let kept = source.file().map(crate::container::zip::KeptReads::new);
        let kept_plain = KeptPlain::default();
        let scan_here = || match &kept {
            Some(kept) => {
                crate::scan::scan_file_bytes(source.bytes(), kept, Some(&kept_plain), &opts.limits)
            }
            None => crate::scan::scan_bytes(source.bytes(), &opts.limits),
        };
        let (report, decoded) = match (opts.scan || opts.refuse_at.is_some(), source.fetcher()) {
            (false, _) => (None, None),
            // Read by ranges: scanned first only to refuse (else when
            // asked, over what the decode fetched, as without the option).
            (true, Some(_)) if opts.refuse_at.is_none() => (None, None),
            (true, Some(fetcher)) => {
                let report = crate::scan::scan_fetched(fetcher, source.extents(), &opts.limits)?;
                (Some(report), None)
            }
            // A small archive's pickle scans in less time than a thread
            // takes to start: scanned here, before the decode.
            (true, None) if !worth_a_thread(source) => (Some(scan_here()), None),
            (true, None) => std::thread::scope(|scope| {
                let scan = std::thread::Builder::new()
                    .name("ptload-scan".into())
                    .spawn_scoped(scope, || match source.file() {
                        Some(file) => {
                            let kept = crate::container::zip::KeptReads::new(file);
                            crate::scan::scan_file_bytes(source.bytes(), &kept, None, &opts.limits)
                        }
                        None => crate::scan::scan_bytes(source.bytes(), &opts.limits),
                    });
                let decoded = Checkpoint::decode(source.clone(), opts);
                // A thread the system refused to start: scanned here.
                let report = scan.ok().and_then(|h| h.join().ok());
                (Some(report.unwrap_or_else(scan_here)), Some(decoded))
            }),
        };
        if let (Some(level), Some(report)) = (opts.refuse_at, &report) {
            refuse_at(report, level)?;
        }
        let decoded = decoded.unwrap_or_else(|| {
            let headers = kept.as_ref().map(Headers::Kept);
            Checkpoint::decode_with(source.clone(), opts, headers, Some(&kept_plain))
        });
        let mut checkpoint = match decoded {
            Err(e) if e.kind() == ErrorKind::UnsupportedGlobal => {
                Err(every_refusal(e, source, opts))
            }
            other => other,
        }?;
        checkpoint.scanned = report;
        Ok(checkpoint)
    }

    /// Decode `source` (without the `scan` feature there is no scan to
    /// run beside it).
    #[cfg(not(feature = "scan"))]
    pub(super) fn scan_and_decode(source: &Source, opts: &OpenOptions) -> Result<Checkpoint> {
        match Checkpoint::decode(source.clone(), opts) {
            Err(e) if e.kind() == ErrorKind::UnsupportedGlobal => {
                Err(every_refusal(e, source, opts))
            }
            other => other,
        }
    }

    fn decode(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        Checkpoint::decode_with(source, opts, None, None)
    }

    /// [`Checkpoint::decode`], reading a zip's local headers as `headers`
    /// says (by default, as the source's file allows), and taking the read
    /// of its `data.pkl` `kept` holds when it is of the same bytes.
    fn decode_with(
        source: Source,
        opts: &OpenOptions,
        headers: Option<Headers<'_>>,
        kept: Option<&KeptPlain>,
    ) -> Result<Checkpoint> {
        let detected = detect(source.view())?;
        if detected == Detected::Safetensors {
            return Checkpoint::from_safetensors(source, opts);
        }
        let mut heap = Heap::new(&opts.limits);
        let mut interp = TorchInterp::new(opts.policy, &opts.allowed_globals);
        let (decoded, leading) = decode_pickles(
            &source,
            headers,
            kept,
            detected,
            opts,
            &mut heap,
            &mut interp,
        )?;
        let (storages, inflated) = storage_infos(decoded.storages, decoded.bytes);
        let mut warnings = decoded.notes;
        let objects_root = decoded.roots.first().map(|&(v, _)| v);
        let (walked, tensors, dtensors, objects): (Walked, _, DTensors, _) = match decoded.plain {
            Some(plain) => {
                check_tensor_count(plain.tensors.len(), &opts.limits)?;
                // Room made first: a collect of results grows by copies.
                let mut tensors = Vec::with_capacity(plain.tensors.len());
                for t in plain.tensors {
                    let info = crate::torch::tensor::plain_tensor_info(t, &storages, &opts.limits)?;
                    tensors.push(info);
                }
                let walked = Walked {
                    by_name: plain.by_name,
                    steps: plain.work,
                    ..Walked::default()
                };
                (walked, tensors, Vec::new(), None)
            }
            None => {
                let mut walked = walk_all(
                    &heap,
                    &decoded.roots,
                    &opts.limits,
                    storages.len(),
                    opts.objects,
                )?;
                check_tensor_count(walked.tensors.len(), &opts.limits)?;
                let first_walked = FirstWalked::of(&heap, &walked.tensors, opts.objects);
                warnings.append(&mut walked.warnings);
                let named = std::mem::take(&mut walked.tensors);
                let (tensors, dtensors) = walked_tensors(&heap, named, &storages, &opts.limits)?;
                let objects = match objects_root.filter(|_| opts.objects) {
                    None => None,
                    Some(root) => Some(object_graph(
                        &heap,
                        root,
                        &first_walked,
                        &tensors,
                        &storages,
                        &opts.limits,
                    )?),
                };
                (walked, tensors, dtensors, objects)
            }
        };
        warnings.extend(dtensor_warning(&dtensors));
        let fetched = match source.fetcher() {
            None => Fetched::default(),
            Some(_) => Fetched::for_parts(&file_offsets(&storages), &opts.limits),
        };
        Ok(Checkpoint {
            source,
            owned: Vec::new(),
            lazy: None,
            inputs: Vec::new(),
            inflated,
            format: decoded.format,
            byte_order: decoded.byte_order,
            pickle_protocol: decoded.protocol,
            storages,
            tensors,
            dtensors,
            values: walked.values,
            value_calls: walked.value_calls,
            callables: walked.callables,
            globals: leading.into_iter().chain(interp.globals).collect(),
            warnings,
            limits: opts.limits.clone(),
            #[cfg(feature = "scan")]
            scanned: None,
            by_name: walked.by_name,
            work: heap.work().saturating_add(walked.steps),
            objects,
            scattered: std::sync::atomic::AtomicBool::new(false),
            end: decoded.end,
            fetched,
        })
    }

    /// A checkpoint of tensors put together in memory (a DCP directory's
    /// chunks): each `(name, dtype, shape, row-major host-order bytes)` its
    /// own storage (without bytes, a tensor with no storage, whose data
    /// lies elsewhere), with the values and warnings given; `protocol` is
    /// that of the pickle that described them.
    pub(crate) fn assembled(
        parts: Vec<AssembledTensor>,
        values: Vec<(String, Scalar)>,
        warnings: Vec<Warning>,
        protocol: u8,
        format: Format,
    ) -> Result<Checkpoint> {
        let parts = parts.into_iter().map(|(name, dtype, shape, bytes)| {
            let held = bytes.map_or(Held::Elsewhere, Held::Owned);
            (name, dtype, shape, held)
        });
        Checkpoint::of_parts(parts, values, warnings, protocol, format)
    }

    /// A checkpoint of whole row-major tensors, each its own storage: the
    /// body of [`assembled`](Self::assembled), whose storages may also lie
    /// in the checkpoint's own file (a safetensors file's).
    fn of_parts(
        parts: impl ExactSizeIterator<Item = (String, DType, Vec<u64>, Held)>,
        values: Vec<(String, Scalar)>,
        warnings: Vec<Warning>,
        protocol: u8,
        format: Format,
    ) -> Result<Checkpoint> {
        let mut by_name = NameIndex::with_capacity(parts.len());
        let mut storages = Vec::with_capacity(parts.len());
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(parts.len());
        let mut owned = Vec::with_capacity(parts.len());
        for (i, (name, dtype, shape, held)) in parts.enumerate() {
            let at =
                u32::try_from(i).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
            let numel = shape
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| {
                    Error::new(ErrorKind::Tensor, "shape overflows").for_tensor(&name)
                })?;
            let nbytes = numel
                .checked_mul(dtype.size() as u64)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "size overflows").for_tensor(&name))?;
            if matches!(&held, Held::Owned(b) if b.len() as u64 != nbytes) {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    format!("{nbytes} bytes for {numel} elements of {dtype}"),
                )
                .for_tensor(&name));
            }
            let mut stride = vec![1u64; shape.len()];
            let mut acc = 1u64;
            for (s, &d) in stride.iter_mut().zip(&shape).rev() {
                *s = acc;
                acc = acc.saturating_mul(d.max(1));
            }
            let hash = by_name.hash(name.as_str());
            let name_of = |j: u32| tensors.get(j as usize).map(|t| t.name.as_str());
            if by_name.find_hashed(hash, &name, name_of).is_some() {
                return Err(
                    Error::new(ErrorKind::DuplicateName, "two tensors of this name")
                        .for_tensor(&name),
                );
            }
            let (file_offset, data) = match held {
                Held::Owned(bytes) => {
                    owned.push(bytes);
                    (None, Some(StorageData::Owned(owned.len() - 1)))
                }
                Held::File(at) => (Some(at), Some(StorageData::File(at))),
                Held::Elsewhere => (None, None),
            };
            let storage = data.map(|data| {
                storages.push(StorageInfo {
                    key: storages.len().to_string(),
                    location: "cpu".to_owned(),
                    dtype,
                    numel,
                    nbytes,
                    record: None,
                    file_offset,
                    data,
                    quantized: None,
                });
                storages.len() - 1
            });
            tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                stride,
                storage_offset: 0,
                storage,
                numel,
                nbytes,
                requires_grad: false,
                conj: false,
                neg: false,
                quantization: None,
            });
            by_name.insert_hashed(hash, at, |j| {
                tensors.get(j as usize).map(|t| t.name.as_str())
            });
        }
        Ok(Checkpoint {
            source: Source::owned(Vec::new(), None),
            owned,
            lazy: None,
            inputs: Vec::new(),
            inflated: Vec::new(),
            format,
            byte_order: ByteOrder::HOST,
            pickle_protocol: protocol,
            storages,
            tensors,
            dtensors: Vec::new(),
            values,
            value_calls: Vec::new(),
            callables: Vec::new(),
            globals: Vec::new(),
            warnings,
            limits: Limits::default(),
            #[cfg(feature = "scan")]
            scanned: None,
            by_name,
            work: 0,
            objects: None,
            scattered: std::sync::atomic::AtomicBool::new(false),
            end: 0,
            fetched: Fetched::default(),
        })
    }

    /// A safetensors file: each tensor its own storage, a view of the
    /// file's bytes (little-endian, as the format stores them); the
    /// header's `__metadata__` as string values; with `opts.objects`, the
    /// `{name: tensor}` dict safetensors' `load_file` returns.
    fn from_safetensors(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        let header = crate::container::safetensors::parse(source.view(), &opts.limits, |name| {
            DType::from_safetensors_name(name).map(|d| d.size() as u64)
        })?;
        let start = header.data_start;
        let mut parts = Vec::with_capacity(header.entries.len());
        for e in header.entries {
            let at = start
                .checked_add(e.begin)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "offset overflows"))?;
            let dtype = DType::from_safetensors_name(&e.dtype).ok_or_else(|| {
                Error::new(
                    ErrorKind::Tensor,
                    format!("dtype {:?} is not one ptload reads", e.dtype),
                )
            })?;
            parts.push((e.name, dtype, e.shape, Held::File(at)));
        }
        let values = header
            .metadata
            .into_iter()
            .map(|(k, v)| (k, Scalar::Str(v)))
            .collect();
        let mut ckpt = Checkpoint::of_parts(
            parts.into_iter(),
            values,
            Vec::new(),
            0,
            Format::Safetensors,
        )?;
        ckpt.byte_order = ByteOrder::Little;
        ckpt.end = header.end;
        ckpt.limits = opts.limits.clone();
        if opts.objects {
            ckpt.objects = Some(crate::object::name_dict(&ckpt.tensors));
        }
        ckpt.fetched = match source.fetcher() {
            None => Fetched::default(),
            Some(_) => Fetched::for_parts(&file_offsets(&ckpt.storages), &ckpt.limits),
        };
        ckpt.source = source;
        Ok(ckpt)
    }
}

/// A zip behind other bytes: torch.load reads such a file as a pickle
/// stream from its first byte. The globals of the pickles it would run
/// there are listed first (under the record `(bytes before the zip)`), and
/// under the strict policy they must be allowed too: a code-running pickle
/// followed by a real checkpoint is refused, as torch refuses it.
#[cfg(feature = "scan")]
fn leading_globals(data: &[u8], opts: &OpenOptions) -> Result<Vec<GlobalRef>> {
    let report = crate::scan::scan_bytes(data, &opts.limits);
    let stream = report
        .pickles
        .iter()
        .filter(|p| p.reachable && matches!(p.source, crate::scan::PickleSource::Stream { .. }));
    let globals: Vec<GlobalRef> = stream
        .flat_map(|p| &p.globals)
        .map(|g| GlobalRef {
            module: g.module.clone(),
            name: g.name.clone(),
            record: "(bytes before the zip)".into(),
            offset: g.offset,
            torch_allowed: crate::torch::policy::torch_allows(&g.module, &g.name),
            called: matches!(
                g.usage,
                crate::scan::Usage::Called | crate::scan::Usage::LookedUp
            ),
            instantiated: g.usage == crate::scan::Usage::Instantiated,
        })
        .collect();
    if opts.policy != Policy::Strict {
        return Ok(globals);
    }
    let refused: Vec<String> = globals
        .iter()
        .filter(|g| {
            !g.torch_allowed
                && !crate::torch::policy::user_allows(&opts.allowed_globals, &g.module, &g.name)
        })
        .map(GlobalRef::path)
        .collect();
    match refused.first() {
        None => Ok(globals),
        Some(first) => Err(Error::new(
            ErrorKind::UnsupportedGlobal,
            format!(
                "Unsupported global: GLOBAL {first} was not an allowed global by default; the \
                 file does not start with a zip header, so torch.load unpickles the bytes before \
                 the archive, which name {}",
                refused.join(", ")
            ),
        )),
    }
}

/// A zip behind other bytes, without the `scan` feature: what torch.load
/// would run there cannot be listed, so the file is refused (fail closed)
/// rather than read past them.
#[cfg(not(feature = "scan"))]
fn leading_globals(_data: &[u8], _opts: &OpenOptions) -> Result<Vec<GlobalRef>> {
    Err(Error::new(
        ErrorKind::Unsupported,
        "the file does not start with a zip header: torch.load would unpickle the bytes before \
         the archive, and listing what they call needs ptload-reader's feature `scan` (off in \
         this build)",
    ))
}

/// Where each storage lies in the file (`None`: not in it), by index.
fn file_offsets(storages: &[StorageInfo]) -> Vec<Option<u64>> {
    storages.iter().map(|s| s.file_offset).collect()
}

//! FSDP rank files: one `torch.save(model.state_dict())` per rank of a
//! sharded model (`model_world_size_4_rank_0.pt` ...), read as one state
//! dict.
//!
//! FSDP2 saves DTensors: each file holds its rank's local part of every
//! tensor with the spec torch records beside it (the device mesh, the
//! rank's coordinate on it, and a placement per mesh dimension). [`merge`]
//! puts the parts together: a tensor `Shard(d)` on a mesh dimension is
//! cut along `d` as `torch.chunk` cuts it (the last parts shorter, or
//! empty), and every rank's part must have exactly the shape that rule
//! gives it; parts `Replicate()` on a mesh dimension are taken once and
//! every copy must be equal, byte for byte (an error names the key and
//! the two ranks); `Partial` (a reduction not yet done) is an error, as is
//! a mesh, shape or placement on which the files disagree, a coordinate no
//! file holds, or two files holding the same one. Tensors that are not
//! DTensors (buffers, optimizer steps) must be equal on every rank, and
//! are taken once.
//!
//! Files of plain local shards (`DTensor.to_local()` saved) record no
//! mesh: a [`LocalLayout`] gives it, with the placements of each tensor by
//! name pattern; in a directory it is the sidecar [`SIDECAR`]:
//!
//! ```json
//! {"mesh": [2],
//!  "placements": [{"match": "optim.state.*.step", "placements": ["Replicate()"]},
//!                 {"match": "*", "placements": ["Shard(0)"]}]}
//! ```
//!
//! The files are then ranks in order (rank `r` at coordinate `r` of the
//! mesh, row-major).
//!
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
//! use ptload_reader::set::CheckpointSet;
//!
//! let set = CheckpointSet::open("../../fixtures/files/fsdp/world4")?;
//! let (_, w) = set.tensor("model.fc1.weight").unwrap();
//! assert_eq!(w.shape(), &[10, 6]); // 3 + 3 + 3 + 1 rows from four ranks
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;

use super::boxes::{copy_box, volume};
use crate::advice::Warning;
use crate::checkpoint::Checkpoint;
use crate::container::Format;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::torch::dtype::DType;
use crate::torch::names::Scalar;

pub use crate::torch::dtensor::{DTensorSpec, MeshPlacement};

/// The sidecar file a directory of plain local shards carries: the mesh
/// and each tensor's placements (see the module's docs).
pub const SIDECAR: &str = "ptload-placements.json";

/// The mesh and placements of plain local shards, which the files do not
/// record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLayout {
    mesh: Vec<u64>,
    rules: Vec<(String, Vec<MeshPlacement>)>,
}

impl LocalLayout {
    /// A mesh of these sizes, and `(pattern, placements)` rules: a
    /// tensor's placements are those of the first pattern (`*` and `?`
    /// wildcards) its name matches.
    pub fn new(mesh: Vec<u64>, rules: Vec<(String, Vec<MeshPlacement>)>) -> Result<LocalLayout> {
        let bad = |m: String| Error::new(ErrorKind::InvalidSpec, m);
        if mesh.is_empty() || mesh.contains(&0) {
            return Err(bad(format!(
                "a mesh of {mesh:?}: each size must be 1 or more"
            )));
        }
        for (pattern, placements) in &rules {
            if placements.len() != mesh.len() {
                return Err(bad(format!(
                    "{pattern:?} has {} placements for a mesh of {} dimensions",
                    placements.len(),
                    mesh.len()
                )));
            }
        }
        Ok(LocalLayout { mesh, rules })
    }

    /// The layout the JSON sidecar describes:
    /// `{"mesh": [sizes], "placements": [{"match": pattern, "placements":
    /// ["Shard(0)" | "Replicate()", ...]}, ...]}`.
    pub fn from_json(text: &[u8]) -> Result<LocalLayout> {
        struct Doc {
            mesh: Vec<u64>,
            placements: Vec<(String, Vec<String>)>,
        }
        fn read(text: &[u8]) -> crate::json::JsonResult<Doc> {
            let mut r = crate::json::Reader::new(text)?;
            r.begin_object("the placements file")?;
            let (mut mesh, mut placements) = (None, None);
            while let Some(key) = r.key()? {
                match &*key {
                    "mesh" if mesh.is_none() => mesh = Some(r.u64_list("mesh", usize::MAX)?),
                    "placements" if placements.is_none() => {
                        let mut rules = Vec::new();
                        match r.token()? {
                            crate::json::Token::BeginArray => {}
                            t => {
                                return Err(
                                    r.error(format!("placements is {}, not a list", t.what()))
                                )
                            }
                        }
                        loop {
                            match r.token()? {
                                crate::json::Token::EndArray => break,
                                crate::json::Token::BeginObject => {}
                                t => {
                                    return Err(
                                        r.error(format!("a rule is {}, not an object", t.what()))
                                    )
                                }
                            }
                            let (mut pattern, mut list) = (None, None);
                            while let Some(k) = r.key()? {
                                match &*k {
                                    "match" if pattern.is_none() => {
                                        pattern = Some(r.string_value("match")?)
                                    }
                                    "placements" if list.is_none() => {
                                        list = Some(r.string_list("placements")?)
                                    }
                                    "match" | "placements" => {
                                        return Err(r.error(format!("duplicate field `{k}`")))
                                    }
                                    _ => {
                                        return Err(r.error(format!(
                                            "unknown field `{k}`, expected `match` or `placements`"
                                        )))
                                    }
                                }
                            }
                            let missing = |f: &str| r.error(format!("missing field `{f}`"));
                            rules.push((
                                pattern.ok_or_else(|| missing("match"))?,
                                list.ok_or_else(|| missing("placements"))?,
                            ));
                        }
                        placements = Some(rules);
                    }
                    "mesh" | "placements" => {
                        return Err(r.error(format!("duplicate field `{key}`")))
                    }
                    _ => {
                        return Err(r.error(format!(
                            "unknown field `{key}`, expected `mesh` or `placements`"
                        )))
                    }
                }
            }
            r.end()?;
            let missing = |f: &str| r.error(format!("missing field `{f}`"));
            Ok(Doc {
                mesh: mesh.ok_or_else(|| missing("mesh"))?,
                placements: placements.ok_or_else(|| missing("placements"))?,
            })
        }
        let doc = read(text).map_err(|e| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!("not a placements file ({{\"mesh\": [...], \"placements\": [...]}}): {e}"),
            )
        })?;
        let mut rules = Vec::with_capacity(doc.placements.len());
        for (pattern, list) in doc.placements {
            let placements = list
                .iter()
                .map(|p| parse_placement(p))
                .collect::<Result<Vec<_>>>()?;
            rules.push((pattern, placements));
        }
        LocalLayout::new(doc.mesh, rules)
    }

    /// Rank files cut by `splits` among `world` ranks on one mesh
    /// dimension, as the caller states it (FSDP2's `fully_shard` cuts every
    /// parameter on dim 0: `*=0`): a tensor a rule splits is cut as
    /// `torch.chunk` cuts it, one a rule replicates (or no rule matches)
    /// is whole on every rank, and its copies are checked equal. A
    /// negative dim is refused: it needs the tensor's rank.
    pub fn of_splits(world: u64, splits: &crate::tp::Splits) -> Result<LocalLayout> {
        let mut rules = Vec::with_capacity(splits.rules().len() + 1);
        for (pattern, split) in splits.rules() {
            let placement = match *split {
                crate::tp::Split::Dim(d) => {
                    MeshPlacement::Shard(u64::try_from(d).map_err(|_| {
                        Error::new(
                            ErrorKind::InvalidSpec,
                            format!(
                                "rule {pattern}={d}: rank files are cut on a dim counted from the \
                             first (0, 1, ...)"
                            ),
                        )
                    })?)
                }
                crate::tp::Split::Replicate => MeshPlacement::Replicate,
            };
            rules.push((pattern.clone(), vec![placement]));
        }
        rules.push(("*".to_owned(), vec![MeshPlacement::Replicate]));
        LocalLayout::new(vec![world], rules)
    }

    /// The mesh's sizes.
    pub fn mesh(&self) -> &[u64] {
        &self.mesh
    }

    /// The placements of the tensor `name`: those of the first rule it
    /// matches.
    pub fn placements_for(&self, name: &str) -> Option<&[MeshPlacement]> {
        self.rules
            .iter()
            .find(|(p, _)| crate::glob::glob(p, name))
            .map(|(_, v)| v.as_slice())
    }
}

/// FSDP2's `fully_shard` as rank-file rules: every parameter cut on dim
/// 0, an optimizer's step counters (0-dim tensors) whole on each rank.
pub const FSDP2_RULES: &str = "*.step=replicate,*=0";

/// Rank-file rules as the front ends take them (`--rank-files`,
/// `rank_files=`): `GLOB=DIM` or `GLOB=replicate` rules, comma-separated
/// and tried in order (as tensor-parallel split rules are written), where
/// `fsdp2` stands for [`FSDP2_RULES`] (`model.scale=replicate,fsdp2`: a
/// buffer FSDP2 leaves whole, then its rule).
pub fn rank_rules(text: &str) -> Result<crate::tp::Splits> {
    let rules: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .flat_map(|r| {
            if r.eq_ignore_ascii_case("fsdp2") {
                FSDP2_RULES.split(',').collect()
            } else {
                vec![r]
            }
        })
        .filter(|r| !r.is_empty())
        .collect();
    if rules.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidSpec,
            "no rank-file rules: give GLOB=DIM or GLOB=replicate rules, or fsdp2",
        ));
    }
    crate::tp::Splits::parse(&rules)
}

/// `Shard(1)`, `Replicate()` (a placement as torch prints it).
fn parse_placement(text: &str) -> Result<MeshPlacement> {
    let t = text.trim();
    if t == "Replicate()" || t == "Replicate" {
        return Ok(MeshPlacement::Replicate);
    }
    if let Some(dim) = t
        .strip_prefix("Shard(")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|d| d.trim().trim_start_matches("dim=").parse::<u64>().ok())
    {
        return Ok(MeshPlacement::Shard(dim));
    }
    Err(Error::new(
        ErrorKind::InvalidSpec,
        format!("placement {text:?}: expected Shard(dim) or Replicate()"),
    ))
}

fn tensor_err(name: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tensor, message).for_tensor(name)
}

/// Rank `coordinate`'s box of a tensor of `shape` placed by `placements`
/// on `mesh`: mesh dimensions in order, each `Shard(d)` cutting what is
/// left of dimension `d` as `torch.chunk` does.
fn local_box(
    shape: &[u64],
    mesh: &[u64],
    placements: &[MeshPlacement],
    coordinate: &[u64],
) -> Option<(Vec<u64>, Vec<u64>)> {
    let mut offsets = vec![0u64; shape.len()];
    let mut sizes = shape.to_vec();
    for ((p, &n), &c) in placements.iter().zip(mesh).zip(coordinate) {
        if let MeshPlacement::Shard(d) = p {
            let d = usize::try_from(*d).ok()?;
            let len = *sizes.get(d)?;
            let piece = len.div_ceil(n.max(1));
            let start = c.saturating_mul(piece).min(len);
            let end = start.saturating_add(piece).min(len);
            *offsets.get_mut(d)? += start;
            *sizes.get_mut(d)? = end - start;
        }
    }
    Some((offsets, sizes))
}

/// The mesh coordinate of rank `rank` on `mesh`, row-major.
fn unravel(mut rank: u64, mesh: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; mesh.len()];
    for (c, &n) in out.iter_mut().zip(mesh).rev() {
        *c = rank % n.max(1);
        rank /= n.max(1);
    }
    out
}

/// One rank's part of one tensor.
struct Part<'a> {
    rank: usize,
    coordinate: Vec<u64>,
    shape: Vec<u64>,
    dtype: DType,
    bytes: Cow<'a, [u8]>,
}

/// The rank files `files` (each a name for messages and its checkpoint, in
/// rank order) as one checkpoint of whole tensors, held in memory: see the
/// module's docs. `layout` gives the mesh and placements of files that
/// hold plain local shards; without it, a tensor that is not a DTensor
/// must be the same in every file.
pub fn merge(
    files: &[(String, &Checkpoint)],
    layout: Option<&LocalLayout>,
    limits: &Limits,
) -> Result<Checkpoint> {
    let Some(&(ref first_name, first)) = files.first() else {
        return Err(Error::new(ErrorKind::InvalidSpec, "no rank files"));
    };
    if files.len() > limits.max_set_files {
        return Err(Error::limit("max_set_files", limits.max_set_files as u64));
    }
    check_same_tensors(files, first_name, first)?;
    let mut parts_out = Vec::with_capacity(first.len());
    for t0 in first.tensors() {
        parts_out.push(merge_tensor(t0.name(), files, layout)?);
    }
    let (values, warnings) = values_of(files, first_name, first);
    Checkpoint::assembled(
        parts_out,
        values,
        warnings,
        first.pickle_protocol(),
        Format::Ranks,
    )
}

/// Every rank file holds the tensors `first` holds, and no other.
fn check_same_tensors(
    files: &[(String, &Checkpoint)],
    first_name: &str,
    first: &Checkpoint,
) -> Result<()> {
    for (name, ckpt) in files.iter().skip(1) {
        if ckpt.len() != first.len() {
            return Err(Error::new(
                ErrorKind::Tensor,
                format!(
                    "{} tensors, where {first_name} holds {}: rank files hold the same tensors",
                    ckpt.len(),
                    first.len()
                ),
            )
            .in_file(name));
        }
        for t in ckpt.tensors() {
            if first.tensor(t.name()).is_none() {
                return Err(tensor_err(
                    t.name(),
                    format!("not in {first_name}: rank files hold the same tensors"),
                )
                .in_file(name));
            }
        }
    }
    Ok(())
}

/// A merged tensor as [`Checkpoint::assembled`] takes it: key, dtype,
/// global shape and bytes.
type Whole = (String, DType, Vec<u64>, Option<Vec<u8>>);

/// The tensor `key` put together from every rank's part.
fn merge_tensor(
    key: &str,
    files: &[(String, &Checkpoint)],
    layout: Option<&LocalLayout>,
) -> Result<Whole> {
    let world = files.len() as u64;
    let (specs, mut parts) = read_parts(key, files)?;
    let geo = geometry(key, files, &specs, &mut parts, layout, world)?;
    refuse_unmergeable(key, &geo.placements)?;
    let dtype = common_dtype(key, &parts)?;
    let boxes = place_parts(key, files, &geo, &parts)?;
    let taken = take_each_box_once(key, boxes, &parts, &geo)?;
    let whole = assemble(key, dtype, &geo, &parts, &taken)?;
    Ok((key.to_owned(), dtype, geo.global, Some(whole)))
}

/// Each rank's part of the tensor `key`, and its DTensor spec if it has
/// one.
fn read_parts<'a>(
    key: &str,
    files: &'a [(String, &'a Checkpoint)],
) -> Result<(Vec<Option<&'a DTensorSpec>>, Vec<Part<'a>>)> {
    let mut specs: Vec<Option<&DTensorSpec>> = Vec::with_capacity(files.len());
    let mut parts: Vec<Part<'_>> = Vec::with_capacity(files.len());
    for (rank, (fname, ckpt)) in files.iter().enumerate() {
        let index = ckpt.position(key);
        let view = index
            .and_then(|i| ckpt.tensor_at(i))
            .ok_or_else(|| tensor_err(key, "missing").in_file(fname))?;
        specs.push(index.and_then(|i| ckpt.dtensor_at(i)));
        parts.push(Part {
            rank,
            coordinate: Vec::new(),
            shape: view.shape().to_vec(),
            dtype: view.dtype(),
            bytes: view.data().map_err(|e| e.in_file(fname))?,
        });
    }
    Ok((specs, parts))
}

/// `Partial` and `_StridedShard` parts are not parts of the tensor.
fn refuse_unmergeable(key: &str, placements: &[MeshPlacement]) -> Result<()> {
    for p in placements {
        if matches!(
            p,
            MeshPlacement::Partial(_) | MeshPlacement::StridedShard { .. }
        ) {
            return Err(tensor_err(
                key,
                format!(
                    "its placements are {}: a {p} DTensor's parts are not parts of the tensor \
                     (reduce or redistribute it before saving)",
                    list(placements)
                ),
            ));
        }
    }
    Ok(())
}

/// The dtype every part has.
fn common_dtype(key: &str, parts: &[Part<'_>]) -> Result<DType> {
    let dtype = parts.first().map_or(DType::F32, |p| p.dtype);
    if let Some(p) = parts.iter().find(|p| p.dtype != dtype) {
        return Err(tensor_err(
            key,
            format!("{dtype} in rank 0's file, {} in rank {}'s", p.dtype, p.rank),
        ));
    }
    Ok(dtype)
}

/// Where a part lies in the tensor: offsets, sizes, and the part's index.
type PartBox = (Vec<u64>, Vec<u64>, usize);

/// Every part where the placements put it, with the shape they give.
fn place_parts(
    key: &str,
    files: &[(String, &Checkpoint)],
    geo: &Geometry,
    parts: &[Part<'_>],
) -> Result<Vec<PartBox>> {
    let Geometry {
        mesh,
        placements,
        global,
    } = geo;
    let mut boxes: Vec<PartBox> = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let (offsets, sizes) =
            local_box(global, mesh, placements, &p.coordinate).ok_or_else(|| {
                tensor_err(
                    key,
                    format!(
                        "its placements {} do not fit its shape {global:?}",
                        list(placements)
                    ),
                )
            })?;
        if sizes != p.shape {
            return Err(tensor_err(
                key,
                format!(
                    "rank {}'s part has shape {:?}, where {} of {global:?} on a mesh of \
                     {mesh:?} gives {sizes:?} at {:?}: the parts do not tile the tensor",
                    p.rank,
                    p.shape,
                    list(placements),
                    p.coordinate
                ),
            )
            .in_file(file_name(files, p.rank)));
        }
        boxes.push((offsets, sizes, i));
    }
    Ok(boxes)
}

/// The parts to copy, one per box: copies of one box (replicated) must
/// agree, and the boxes taken must cover the tensor.
fn take_each_box_once(
    key: &str,
    mut boxes: Vec<PartBox>,
    parts: &[Part<'_>],
    geo: &Geometry,
) -> Result<Vec<usize>> {
    boxes.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));
    let mut taken: Vec<usize> = Vec::new();
    let mut covered = 0u64;
    for w in 0..boxes.len() {
        let Some((offsets, sizes, i)) = boxes.get(w) else {
            continue;
        };
        let previous = w.checked_sub(1).and_then(|v| boxes.get(v));
        match previous {
            Some((o, _, j)) if o == offsets => {
                let (a, b) = (parts.get(*j), parts.get(*i));
                if let (Some(a), Some(b)) = (a, b) {
                    if a.bytes != b.bytes {
                        return Err(tensor_err(
                            key,
                            format!(
                                "replicated, but rank {} and rank {} hold different values{}",
                                a.rank,
                                b.rank,
                                if offsets.iter().any(|&o| o > 0) {
                                    format!(" for its part at {offsets:?}")
                                } else {
                                    String::new()
                                }
                            ),
                        ));
                    }
                }
            }
            _ => {
                covered = covered.saturating_add(volume(sizes));
                taken.push(*i);
            }
        }
    }
    if covered != volume(&geo.global) {
        return Err(tensor_err(
            key,
            format!(
                "its parts cover {covered} of its {} elements",
                volume(&geo.global)
            ),
        ));
    }
    Ok(taken)
}

/// The whole tensor's bytes: each taken part copied into its box.
fn assemble(
    key: &str,
    dtype: DType,
    geo: &Geometry,
    parts: &[Part<'_>],
    taken: &[usize],
) -> Result<Vec<u8>> {
    let Geometry {
        mesh,
        placements,
        global,
    } = geo;
    let elem = dtype.size() as u64;
    let nbytes = volume(global)
        .checked_mul(elem)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| tensor_err(key, format!("its shape {global:?} is too large")))?;
    let mut whole = vec![0u8; nbytes];
    let zeros = vec![0u64; global.len()];
    for &i in taken {
        let Some(p) = parts.get(i) else { continue };
        let (offsets, _) = local_box(global, mesh, placements, &p.coordinate)
            .ok_or_else(|| tensor_err(key, "no box"))?;
        copy_box(
            &p.bytes, &offsets, &p.shape, &mut whole, &zeros, global, elem,
        )
        .map_err(|e| e.for_tensor(key))?;
    }
    Ok(whole)
}

/// Values (hyperparameters, steps as ints...): rank 0's; a rank that
/// disagrees is reported. With them, rank 0's warnings but the one that
/// its tensors are DTensors.
fn values_of(
    files: &[(String, &Checkpoint)],
    first_name: &str,
    first: &Checkpoint,
) -> (Vec<(String, Scalar)>, Vec<Warning>) {
    let mut warnings: Vec<Warning> = first
        .warnings()
        .iter()
        .filter(|w| !matches!(w, Warning::LocalParts { .. }))
        .cloned()
        .collect();
    let values: Vec<(String, Scalar)> = first.values().to_vec();
    for (name, ckpt) in files.iter().skip(1) {
        if ckpt.values() != first.values() {
            let key = ckpt
                .values()
                .iter()
                .zip(first.values())
                .find(|(a, b)| a != b)
                .map(|(a, _)| a.0.clone());
            warnings.push(Warning::ValuesDiffer {
                file: name.clone(),
                kept: first_name.to_owned(),
                key,
            });
        }
    }
    (values, warnings)
}

fn list(placements: &[MeshPlacement]) -> String {
    let items: Vec<String> = placements.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

fn file_name<'a>(files: &'a [(String, &Checkpoint)], rank: usize) -> &'a str {
    files.get(rank).map_or("", |(n, _)| n.as_str())
}

/// How a tensor lies on the ranks: the mesh, a placement per mesh
/// dimension, and the tensor's global shape.
struct Geometry {
    mesh: Vec<u64>,
    placements: Vec<MeshPlacement>,
    global: Vec<u64>,
}

/// The geometry of the tensor `key`, with each part's coordinate set: from
/// the DTensor specs when every file has one, else from `layout`, else (no
/// DTensor, no layout) replicated on every rank.
fn geometry(
    key: &str,
    files: &[(String, &Checkpoint)],
    specs: &[Option<&DTensorSpec>],
    parts: &mut [Part<'_>],
    layout: Option<&LocalLayout>,
    world: u64,
) -> Result<Geometry> {
    refuse_mixed(key, files, specs)?;
    if let Some(Some(first)) = specs.first() {
        return from_specs(key, files, first, specs, parts, world);
    }
    from_layout(key, parts, layout, world)
}

/// A tensor is a DTensor in every file or in none.
fn refuse_mixed(
    key: &str,
    files: &[(String, &Checkpoint)],
    specs: &[Option<&DTensorSpec>],
) -> Result<()> {
    let with = specs.iter().filter(|s| s.is_some()).count();
    if with > 0 && with < specs.len() {
        let plain = specs.iter().position(Option::is_none).unwrap_or(0);
        let dt = specs.iter().position(Option::is_some).unwrap_or(0);
        return Err(tensor_err(
            key,
            format!(
                "a DTensor in {}, a plain tensor in {}",
                file_name(files, dt),
                file_name(files, plain)
            ),
        ));
    }
    Ok(())
}

/// The number of ranks on `mesh` (saturating).
fn mesh_cells(mesh: &[u64]) -> u64 {
    mesh.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .unwrap_or(u64::MAX)
}

/// The geometry rank 0's DTensor spec `first` records, which every file's
/// spec must repeat, one file per coordinate of the mesh.
fn from_specs(
    key: &str,
    files: &[(String, &Checkpoint)],
    first: &DTensorSpec,
    specs: &[Option<&DTensorSpec>],
    parts: &mut [Part<'_>],
    world: u64,
) -> Result<Geometry> {
    check_specs_agree(key, files, first, specs)?;
    let cells = mesh_cells(&first.mesh);
    let seen = set_coordinates(key, files, specs, parts)?;
    if cells != world {
        let missing = (0..cells.min(world.saturating_add(8)))
            .map(|r| unravel(r, &first.mesh))
            .find(|c| !seen.iter().any(|(s, _)| s == c));
        return Err(tensor_err(
            key,
            format!(
                "its mesh {:?} has {cells} ranks, and {world} files were given{}",
                first.mesh,
                missing.map_or_else(String::new, |c| format!(
                    ": no file holds the part at {c:?} (ranks missing)"
                ))
            ),
        ));
    }
    Ok(Geometry {
        mesh: first.mesh.clone(),
        placements: first.placements.clone(),
        global: first.global_shape.clone(),
    })
}

/// Every file's spec has rank 0's mesh, placements and global shape.
fn check_specs_agree(
    key: &str,
    files: &[(String, &Checkpoint)],
    first: &DTensorSpec,
    specs: &[Option<&DTensorSpec>],
) -> Result<()> {
    for (rank, s) in specs.iter().enumerate().skip(1) {
        let Some(s) = s else { continue };
        let what = if s.mesh != first.mesh {
            Some(format!(
                "a mesh of {:?}, where rank 0's file has {:?}",
                s.mesh, first.mesh
            ))
        } else if s.placements != first.placements {
            Some(format!(
                "placements {}, where rank 0's file has {}",
                list(&s.placements),
                list(&first.placements)
            ))
        } else if s.global_shape != first.global_shape {
            Some(format!(
                "a global shape of {:?}, where rank 0's file has {:?}",
                s.global_shape, first.global_shape
            ))
        } else {
            None
        };
        if let Some(what) = what {
            return Err(tensor_err(key, format!("the files disagree: {what}"))
                .in_file(file_name(files, rank)));
        }
    }
    Ok(())
}

/// Each part's coordinate from its spec, no two the same: the coordinates
/// seen, each with the rank that holds it.
fn set_coordinates(
    key: &str,
    files: &[(String, &Checkpoint)],
    specs: &[Option<&DTensorSpec>],
    parts: &mut [Part<'_>],
) -> Result<Vec<(Vec<u64>, usize)>> {
    let mut seen: Vec<(Vec<u64>, usize)> = Vec::with_capacity(parts.len());
    for (p, s) in parts.iter_mut().zip(specs) {
        let Some(s) = s else { continue };
        p.coordinate.clone_from(&s.coordinate);
        if let Some((_, r)) = seen.iter().find(|(c, _)| *c == s.coordinate) {
            return Err(tensor_err(
                key,
                format!(
                    "{} and {} both hold the part at {:?} of the mesh {:?}",
                    file_name(files, *r),
                    file_name(files, p.rank),
                    s.coordinate,
                    s.mesh
                ),
            ));
        }
        seen.push((s.coordinate.clone(), p.rank));
    }
    Ok(seen)
}

/// The geometry of plain local parts: the mesh and placements from
/// `layout` (without one, replicated on every rank), the files ranks in
/// order, the global shape from the parts' shapes.
fn from_layout(
    key: &str,
    parts: &mut [Part<'_>],
    layout: Option<&LocalLayout>,
    world: u64,
) -> Result<Geometry> {
    let (mesh, placements) = match layout {
        Some(l) => {
            let placements = l
                .placements_for(key)
                .ok_or_else(|| tensor_err(key, format!("no rule of {SIDECAR} matches its name")))?;
            (l.mesh.clone(), placements.to_vec())
        }
        None => (vec![world], vec![MeshPlacement::Replicate]),
    };
    let cells = mesh_cells(&mesh);
    if cells != world {
        return Err(tensor_err(
            key,
            format!("the mesh {mesh:?} has {cells} ranks, and {world} files were given"),
        ));
    }
    for p in parts.iter_mut() {
        p.coordinate = unravel(p.rank as u64, &mesh);
    }
    let global = global_shape(parts, &placements);
    for p in &placements {
        if let MeshPlacement::Shard(d) = p {
            if *d >= global.len() as u64 {
                return Err(tensor_err(
                    key,
                    format!("{p} of a tensor of {} dimensions", global.len()),
                ));
            }
        }
    }
    Ok(Geometry {
        mesh,
        placements,
        global,
    })
}

/// The global shape: along each sharded dimension, the sum of the parts
/// of the ranks at coordinate 0 on every mesh dimension that does not
/// cut it (they partition it); elsewhere, rank 0's size.
fn global_shape(parts: &[Part<'_>], placements: &[MeshPlacement]) -> Vec<u64> {
    // No part: no dimension to size.
    let first_shape = parts.first().map_or_else(Vec::new, |p| p.shape.clone());
    let mut global = first_shape.clone();
    for (d, size) in global.iter_mut().enumerate() {
        let cutting: Vec<bool> = placements
            .iter()
            .map(|p| *p == MeshPlacement::Shard(d as u64))
            .collect();
        if !cutting.contains(&true) {
            continue;
        }
        *size = parts
            .iter()
            .filter(|p| {
                p.coordinate
                    .iter()
                    .zip(&cutting)
                    .all(|(&c, &cuts)| cuts || c == 0)
            })
            .map(|p| p.shape.get(d).copied().unwrap_or(0))
            .fold(0u64, u64::saturating_add);
    }
    global
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_cut_as_torch_chunk_cuts() {
        let rows = |len: u64, world: u64| -> Vec<u64> {
            (0..world)
                .map(|c| {
                    local_box(&[len, 2], &[world], &[MeshPlacement::Shard(0)], &[c])
                        .unwrap()
                        .1[0]
                })
                .collect()
        };
        assert_eq!(rows(10, 4), vec![3, 3, 3, 1]);
        assert_eq!(rows(3, 4), vec![1, 1, 1, 0]);
        assert_eq!(rows(2, 4), vec![1, 1, 0, 0]);
        // Two mesh dimensions cutting one tensor dimension: the second
        // cuts the first's part.
        let mesh = [2, 2];
        let both = [MeshPlacement::Shard(0), MeshPlacement::Shard(0)];
        let got: Vec<(u64, u64)> = (0..4)
            .map(|r| {
                let (o, s) = local_box(&[7], &mesh, &both, &unravel(r, &mesh)).unwrap();
                (o[0], s[0])
            })
            .collect();
        assert_eq!(got, vec![(0, 2), (2, 2), (4, 2), (6, 1)]);
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        // A placement past the tensor's dimensions fits nowhere.
        assert!(local_box(&[4], &[2], &[MeshPlacement::Shard(1)], &[0]).is_none());
    }
}

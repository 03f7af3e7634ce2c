//! The unpickled object graph (`OpenOptions::objects`): what torch.load
//! returns, checked on files torch wrote. The Python package's tests compare
//! the rebuilt objects with torch's own load, object for object.

use ptload_reader::object::Node;
use ptload_reader::OpenOptions;

fn open(name: &str) -> ptload_reader::Checkpoint {
    OpenOptions::new()
        .objects(true)
        .open(format!(
            "{}/../../fixtures/files/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
}

#[test]
fn a_state_dict_is_an_ordered_dict_of_tensors_with_its_metadata() {
    let ckpt = open("basic.pt");
    let objects = ckpt.objects().unwrap();
    let Some(Node::Dict {
        ordered: true,
        items,
        state: Some(state),
    }) = objects.node(objects.root())
    else {
        panic!("root is {:?}", objects.node(objects.root()));
    };
    assert_eq!(items.len(), ckpt.len());
    for (&(k, v), flat) in items.iter().zip(ckpt.tensors()) {
        let Some(Node::Str(key)) = objects.node(k) else {
            panic!("key {k}")
        };
        assert_eq!(key, flat.name());
        let Some(&Node::Tensor { tensor, .. }) = objects.node(v) else {
            panic!("value {v}")
        };
        let view = ckpt.object_tensor(tensor).unwrap();
        assert_eq!(view.info(), flat.info());
        assert_eq!(view.data().unwrap(), flat.data().unwrap());
    }
    // `_metadata`, set by BUILD on the OrderedDict.
    let Some(Node::Dict { items: attrs, .. }) = objects.node(*state) else {
        panic!("state {state}")
    };
    assert!(matches!(objects.node(attrs[0].0), Some(Node::Str(s)) if s == "_metadata"));
}

#[test]
fn members_of_immutable_values_come_first() {
    for name in [
        "training.ckpt",
        "quantized.pt",
        "sparse.pt",
        "parameter_state.pt",
        "whole_module.pt",
    ] {
        let ckpt = open(name);
        let objects = ckpt.objects().unwrap();
        for (id, node) in objects.nodes().iter().enumerate() {
            let members: Vec<usize> = match node {
                Node::Tuple(m) | Node::Size(m) | Node::FrozenSet(m) => m.clone(),
                Node::Parameter { data, .. } => vec![*data],
                Node::Sparse { data, .. } => vec![*data],
                Node::Tensor {
                    qparams: Some((a, b)),
                    ..
                } => vec![*a, *b],
                _ => continue,
            };
            for m in members {
                let scalar = matches!(
                    objects.node(m),
                    Some(Node::None | Node::Bool(_) | Node::Int(_) | Node::Float(_))
                );
                assert!(
                    m < id || scalar,
                    "{name}: node {id} ({node:?}) has member {m}"
                );
            }
        }
    }
}

#[test]
fn parameters_and_plain_types_keep_their_kind() {
    let ckpt = open("parameter_state.pt");
    let objects = ckpt.objects().unwrap();
    assert!(objects
        .nodes()
        .iter()
        .any(|n| matches!(n, Node::Parameter { .. })));
    let ckpt = open("training.ckpt");
    let objects = ckpt.objects().unwrap();
    assert!(objects.nodes().iter().any(
        |n| matches!(n, Node::NumpyScalar { descr, raw, .. } if descr == "f8" && raw == &0.875f64.to_le_bytes())
    ));
    assert!(objects
        .nodes()
        .iter()
        .any(|n| matches!(n, Node::NdArray { shape, .. } if shape == &[4])));
}

#[test]
fn hostile_files_build_a_graph_or_fail_cleanly() {
    let mut opened = 0;
    for entry in
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/hostile")).unwrap()
    {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        if let Ok(ckpt) = OpenOptions::new().objects(true).open(&path) {
            let objects = ckpt.objects().unwrap();
            assert!(objects.node(objects.root()).is_some(), "{}", path.display());
            for i in 0..objects.tensors().len() {
                let _ = ckpt.object_tensor(i).unwrap().data();
            }
            opened += 1;
        }
    }
    assert!(opened > 10);
}

#[test]
fn python_attributes_of_tensors_and_parameters_come_with_them() {
    // torch.save keeps `t.units = "meters"` and a parameter's `note` as the
    // state of `_rebuild_from_type_v2` / `_rebuild_parameter_with_state`.
    let ckpt = open("parameter_state.pt");
    let objects = ckpt.objects().unwrap();
    let attr_names = |attrs: Option<usize>| -> Vec<String> {
        let Some(Node::Dict { items, .. }) = attrs.and_then(|a| objects.node(a)) else {
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|&(k, _)| match objects.node(k) {
                Some(Node::Str(s)) => Some(s.clone()),
                _ => None,
            })
            .collect()
    };
    let mut tensor_attrs = Vec::new();
    let mut parameter_attrs = Vec::new();
    for node in objects.nodes() {
        match node {
            Node::Tensor { attrs, .. } => tensor_attrs.extend(attr_names(*attrs)),
            Node::Parameter { attrs, .. } => parameter_attrs.extend(attr_names(*attrs)),
            _ => {}
        }
    }
    assert_eq!(tensor_attrs, ["units"]);
    parameter_attrs.sort();
    assert_eq!(parameter_attrs, ["note", "version"]);
}

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/../../fixtures/files/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn checkpoints_saved_one_after_another_end_where_they_end() {
    // Two torch files back to back in one stream (torch.save twice on one
    // file object): the checkpoint is the one the bytes start with, and it
    // ends where the first file ended.
    for (first, second) in [
        ("basic.pt", "views.pt"),
        ("legacy.pt", "basic.pt"),
        ("legacy_views.pt", "legacy.pt"),
    ] {
        let alone = OpenOptions::new().open_bytes(fixture_bytes(first)).unwrap();
        let mut both = fixture_bytes(first);
        let first_len = both.len() as u64;
        both.extend(fixture_bytes(second));
        let ckpt = OpenOptions::new().open_bytes(both).unwrap();
        assert_eq!(ckpt.end_offset(), first_len, "{first} then {second}");
        assert_eq!(alone.end_offset(), first_len, "{first}");
        let names: Vec<_> = ckpt.tensors().map(|t| t.name().to_owned()).collect();
        let expected: Vec<_> = alone.tensors().map(|t| t.name().to_owned()).collect();
        assert_eq!(names, expected, "{first} then {second}");
        for (a, b) in ckpt.tensors().zip(alone.tensors()) {
            assert_eq!(a.data().unwrap(), b.data().unwrap(), "{}", a.name());
        }
    }
}

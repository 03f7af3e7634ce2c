//! torch's rebuild functions: tensors (plain, quantized, sparse) from a
//! storage, an offset, a size and a stride.

use super::*;
use crate::torch::dtensor::{self, is_dtensor_type, is_wrapper_subclass};

impl TorchInterp<'_> {
    pub(super) fn tensor(
        &self,
        heap: &mut Heap,
        storage: Option<usize>,
        dtype: DType,
        offset: i64,
        size: Value,
        stride: Value,
    ) -> Result<TensorMeta> {
        Ok(TensorMeta {
            storage,
            dtype,
            offset,
            shape: int_tuple(heap, size, "tensor size")?,
            stride: int_tuple(heap, stride, "tensor stride")?,
            requires_grad: false,
            conj: false,
            neg: false,
            quant: None,
            attrs: None,
            dtensor: None,
        })
    }

    pub(super) fn storage_tensor(&self, heap: &mut Heap, args: &[Value]) -> Result<TensorMeta> {
        let (id, dtype) = self.storage_of(heap, get(args, 0))?;
        let offset = int(heap, get(args, 1), "storage offset")?;
        self.tensor(heap, Some(id), dtype, offset, get(args, 2), get(args, 3))
    }

    pub(super) fn apply_metadata(&self, heap: &Heap, t: &mut TensorMeta, metadata: Value) {
        if let Some(d) = heap.dict(metadata) {
            t.conj = d.get_str(heap, "conj").is_some_and(truthy);
            t.neg = d.get_str(heap, "neg").is_some_and(truthy);
        }
    }

    pub(super) fn rebuild(
        &mut self,
        heap: &mut Heap,
        which: Known,
        func: &str,
        args: &[Value],
    ) -> Result<Value> {
        let meta = match which {
            Known::RebuildTensor => {
                arity(args, func, &[4])?;
                self.storage_tensor(heap, args)?
            }
            Known::RebuildTensorV2 => {
                arity(args, func, &[6, 7])?;
                let mut t = self.storage_tensor(heap, args)?;
                t.requires_grad = truthy(get(args, 4));
                self.apply_metadata(heap, &mut t, get(args, 6));
                t
            }
            Known::RebuildTensorV3 => {
                arity(args, func, &[7, 8])?;
                let mut t = self.storage_tensor(heap, args)?;
                t.dtype = self.dtype_of(heap, get(args, 6))?;
                t.requires_grad = truthy(get(args, 4));
                self.apply_metadata(heap, &mut t, get(args, 7));
                t
            }
            Known::RebuildQTensor => {
                arity(args, func, &[7])?;
                let mut t = self.storage_tensor(heap, args)?;
                t.requires_grad = truthy(get(args, 5));
                t.quant = Some(self.quant_params(heap, get(args, 4))?);
                t
            }
            Known::RebuildMetaNoStorage => {
                arity(args, func, &[4])?;
                let dtype = self.dtype_of(heap, get(args, 0))?;
                let mut t = self.tensor(heap, None, dtype, 0, get(args, 1), get(args, 2))?;
                t.requires_grad = truthy(get(args, 3));
                t
            }
            Known::RebuildParameter | Known::RebuildParameterWithState => {
                arity(
                    args,
                    func,
                    if which == Known::RebuildParameter {
                        &[3]
                    } else {
                        &[4]
                    },
                )?;
                let data = get(args, 0);
                // (data, requires_grad, backward_hooks[, state]): the state
                // is the parameter's Python attributes.
                let state = get(args, 3);
                let attrs = (which == Known::RebuildParameterWithState && has_attrs(heap, state))
                    .then_some(state);
                return match heap.torch(data) {
                    Some(TorchObj::Tensor(_) | TorchObj::Sparse { .. }) => {
                        heap.alloc_torch(TorchObj::Parameter {
                            data,
                            requires_grad: truthy(get(args, 1)),
                            attrs,
                        })
                    }
                    _ => Err(err(format!(
                        "{func}: data must be a tensor, found {}",
                        describe(heap, data)
                    ))),
                };
            }
            Known::RebuildFromTypeV2 => {
                arity(args, func, &[4])?;
                // (func, type, args, state): the tensor is func(*args); the
                // type and state only decorate it. func is interpreted like
                // any callable: a foreign function stays inert. A state
                // with entries is the tensor's Python attributes.
                let inner = get(args, 0);
                let inner_args = get(args, 2);
                let state = get(args, 3);
                if is_wrapper_subclass(heap, inner) && is_dtensor_type(heap, get(args, 1)) {
                    // A DTensor: its local tensor, with the spec beside it.
                    let (local, spec) = dtensor::read(heap, inner_args, state)?;
                    let mut meta = match heap.torch(local) {
                        Some(TorchObj::Tensor(meta)) => meta.clone(),
                        _ => return Err(err("a DTensor's local tensor is not a tensor")),
                    };
                    meta.dtensor = Some(Box::new(spec));
                    return heap.alloc_torch(TorchObj::Tensor(meta));
                }
                let made = self.call(heap, inner, inner_args)?;
                return match heap.torch(made) {
                    Some(TorchObj::Tensor(meta)) if has_attrs(heap, state) => {
                        let mut meta = meta.clone();
                        meta.attrs = Some(state);
                        heap.alloc_torch(TorchObj::Tensor(meta))
                    }
                    _ => Ok(made),
                };
            }
            Known::RebuildSparse => {
                arity(args, func, &[2])?;
                return self.sparse(heap, get(args, 0), get(args, 1));
            }
            _ => return Err(err(format!("{func} is not a tensor rebuild function"))),
        };
        heap.alloc_torch(TorchObj::Tensor(meta))
    }

    pub(super) fn quant_params(&self, heap: &Heap, v: Value) -> Result<QuantParams> {
        let items = heap
            .tuple(v)
            .ok_or_else(|| err("quantizer params must be a tuple"))?
            .to_vec();
        heap.charge_work(items.len() as u64)?;
        let scheme = match known(heap, get(&items, 0)) {
            Some((Known::QScheme, g)) => g.name.to_string(),
            _ => return Err(err("quantizer params must start with a torch qscheme")),
        };
        if scheme.starts_with("per_tensor") {
            arity(&items, "per-tensor quantizer params", &[3])?;
            Ok(QuantParams::PerTensor {
                scheme,
                scale: float(heap, get(&items, 1), "scale")?,
                zero_point: int(heap, get(&items, 2), "zero point")?,
            })
        } else {
            arity(&items, "per-channel quantizer params", &[4])?;
            for i in [1, 2] {
                if !matches!(heap.torch(get(&items, i)), Some(TorchObj::Tensor(_))) {
                    return Err(err("per-channel scales and zero points must be tensors"));
                }
            }
            Ok(QuantParams::PerChannel {
                scheme,
                scales: get(&items, 1),
                zero_points: get(&items, 2),
                axis: int(heap, get(&items, 3), "axis")?,
            })
        }
    }

    pub(super) fn sparse(&mut self, heap: &mut Heap, layout: Value, data: Value) -> Result<Value> {
        let layout = match heap.torch(layout) {
            Some(TorchObj::Layout(l)) => *l,
            Some(TorchObj::Global(g)) => Layout::from_name(&g.name)
                .ok_or_else(|| err(format!("unknown layout torch.{}", g.name)))?,
            _ => return Err(err("sparse tensor layout must be a torch.layout")),
        };
        let parts = heap
            .tuple(data)
            .ok_or_else(|| err("sparse tensor data must be a tuple"))?
            .to_vec();
        heap.charge_work(parts.len() as u64)?;
        let names = layout.components();
        if names.is_empty() || parts.len() < names.len() {
            return Err(err(format!("sparse tensor data has {} items", parts.len())));
        }
        let components: Vec<Value> = parts.iter().take(names.len()).copied().collect();
        for &c in &components {
            if !matches!(heap.torch(c), Some(TorchObj::Tensor(_))) {
                return Err(err("sparse tensor components must be tensors"));
            }
        }
        heap.alloc_torch(TorchObj::Sparse {
            layout,
            components,
            data,
        })
    }
}

/// Whether a `_rebuild_from_type_v2` state sets any attribute: a non-empty
/// dict, or a `(dict, slots)` pair with one.
fn has_attrs(heap: &Heap, state: Value) -> bool {
    let filled = |v: Value| heap.dict(v).is_some_and(|d| !d.entries().is_empty());
    match heap.tuple(state) {
        Some(&[dict, slots]) => filled(dict) || filled(slots),
        _ => filled(state),
    }
}

//! The pickle layer: a VM that executes no code, over an arena of inert values.

mod value;
mod vm;

pub(crate) use value::{
    kind_name as kind_name_of, Dict, Extension, Heap, Obj, ObjId, Object, Tag, Value,
};
pub use vm::StringEncoding;
pub(crate) use vm::{Interpreter, Vm};

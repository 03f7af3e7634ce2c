//! The container layer: what kind of file this is, and where its records are.

mod detect;
pub(crate) mod legacy;
pub(crate) mod zip;

pub(crate) use detect::{detect, Detected};

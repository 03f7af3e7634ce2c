//! Shared by the device crate's test binaries that count the heap.

pub mod heap;

#![no_main]

libfuzzer_sys::fuzz_target!(|scene: ptload_fuzz::Scene| ptload_fuzz::output_paths(&scene));

#![no_main]

libfuzzer_sys::fuzz_target!(|model: ptload_fuzz::Model| ptload_fuzz::structured(&model));

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ptload_fuzz::dcp(data);
});

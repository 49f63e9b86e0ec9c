#![no_main]
// The checks live in the main crate (`taskgate::fuzzing::wire`), shared with its proptests.
libfuzzer_sys::fuzz_target!(|data: &[u8]| taskgate::fuzzing::wire::fuzz(data));

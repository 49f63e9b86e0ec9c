#![no_main]
// The checks live in the main crate (`taskgate::fuzzing::sse`), shared with its proptests.
libfuzzer_sys::fuzz_target!(|data: &[u8]| taskgate::fuzzing::sse::fuzz(data));

//! Arbitrary bytes as an `x-requested-delay` value. See src/delay.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    delay_router_fuzz::delay::run(data);
});

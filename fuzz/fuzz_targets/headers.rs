//! A header table in AMQP wire format (plus a trailer of properties) through
//! the router's decisions under every strategy. See src/headers.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    delay_router_fuzz::headers::run(data);
});

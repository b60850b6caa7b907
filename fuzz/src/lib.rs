//! Harness shared by the libFuzzer targets (`fuzz_targets/*.rs`), the seed
//! writer (`examples/write_seeds.rs`) and the seed replay test (`cargo test`
//! in this directory).
//!
//! - [`headers`]: input bytes are an AMQP field table in wire format (as a
//!   header table arrives from the broker) plus a trailer of properties, run
//!   through `Rules::decide` (from ingress and from a bucket) under every strategy.
//! - [`delay`]: input bytes are an `x-requested-delay` value, run through
//!   `contract::parse_delay` / `parse_delay_str` and checked against the ladder.
//!
//! Every check panics with a message naming the plan and what went wrong, so a
//! libFuzzer crash report says which invariant broke.

pub mod delay;
pub mod headers;
pub mod plans;
pub mod props;
pub mod seeds;

//! The pure core: every decision about a message, as functions of its
//! headers and properties, the configuration and the clock. No I/O.
//!
//! A delivery's fate is decided once, by [`decision::Rules::decide`]; the
//! other modules are its parts.

pub mod cancel;
pub mod clock;
pub mod compat;
pub mod contract;
pub mod decision;
pub mod delayed;
pub mod envelope;
pub mod glob;
pub mod identity;
pub mod inflight;
pub mod ladder;
pub mod parking;
pub mod placement;
pub mod reasons;
pub mod retry;
pub mod security;
pub mod topology;
pub mod wire;

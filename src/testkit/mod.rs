//! The test kit: fixtures, property-test strategies and broker helpers that
//! the unit tests, the integration tests, the benches and the fuzz crate
//! share, so that none of them copies the crate or each other. Compiled for
//! the crate's own tests and with the `testkit` feature.

pub mod arbitrary;
pub mod consume;
pub mod decide;
pub mod props;
pub mod rules;
pub mod teardown;

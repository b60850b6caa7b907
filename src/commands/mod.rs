//! What the command line does, as library functions (the binary only parses
//! arguments and prints): `declare`, `status`, `parked` and `permissions`.
//! `run` is [`crate::router::run`].

pub mod declare;
pub mod parked;
pub mod permissions;
pub mod status;

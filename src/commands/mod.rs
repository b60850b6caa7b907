//! What the command line does, as library functions (the binary only parses
//! arguments and prints): `declare`, `status`, `parked`, `permissions` and
//! `cancel`.
//! `run` is [`crate::router::run`].

pub mod cancel;
pub mod declare;
pub mod parked;
pub mod permissions;
pub mod status;

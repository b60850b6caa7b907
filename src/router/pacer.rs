//! Lazy confirms on the publish connection (the rules:
//! [`crate::core::pacing`]). A lazy socket has `SO_RCVLOWAT` at
//! [`LAZY_BYTES`]: the kernel keeps a few confirms (21 bytes each) without
//! reporting the socket readable, so they do not wake the router; an eager
//! one is back at 1 byte, and Linux reports it readable at once if anything
//! waits (`tcp_set_rcvlowat`). The timer that ends a lazy period after
//! [`LAZY_FOR`] is [`Pacer::run`].
//!
//! Without a socket to tune (TLS, not Linux) or after a failed
//! `setsockopt`, every publish is eager: the router behaves as before.

use crate::core::pacing::{Change, LAZY_FOR, Pacing};
use std::os::fd::OwnedFd;
use std::sync::{Mutex, PoisonError};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// What a lazy socket holds before it reports readable: a few hundred
/// confirms, far more than [`crate::core::pacing::LAZY_UP_TO`] publishes
/// make.
pub const LAZY_BYTES: i32 = 4096;

/// The pacing of one publish connection.
pub struct Pacer {
    /// The connection's socket (a duplicate descriptor, closed with this).
    socket: Option<OwnedFd>,
    state: Mutex<State>,
    /// The current lazy period and when it ends, for [`Pacer::run`].
    deadline: watch::Sender<Option<(u64, Instant)>>,
}

struct State {
    pacing: Pacing,
    /// A `setsockopt` failed: eager from then on.
    broken: bool,
}

/// One publish counted as unconfirmed until this is dropped.
pub struct Ticket<'a> {
    pacer: &'a Pacer,
    /// Its confirm may be read late: its latency is not the broker's.
    pub late: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.pacer.answered();
    }
}

impl Pacer {
    /// Paces the connection whose socket is `socket` (`None`: always eager).
    pub fn new(socket: Option<OwnedFd>) -> Self {
        let broken = socket.is_none() || !cfg!(target_os = "linux");
        Self {
            socket,
            state: Mutex::new(State {
                pacing: Pacing::default(),
                broken,
            }),
            deadline: watch::Sender::new(None),
        }
    }

    /// A publish is about to be sent; `urgent` when its answer is awaited
    /// before anything else is sent.
    pub fn sent(&self, urgent: bool) -> Ticket<'_> {
        let mut state = self.lock();
        let urgent = urgent || state.broken;
        let (late, change) = state.pacing.sent(urgent);
        if let Some(change) = change {
            self.apply(&mut state, change);
        }
        Ticket {
            pacer: self,
            late: late && state.pacing.is_lazy(),
        }
    }

    /// Whether the socket is lazy now.
    pub fn is_lazy(&self) -> bool {
        self.lock().pacing.is_lazy()
    }

    fn answered(&self) {
        let mut state = self.lock();
        if let Some(change) = state.pacing.answered() {
            self.apply(&mut state, change);
        }
    }

    /// Ends each lazy period at its deadline, until `halt`.
    pub async fn run(&self, halt: CancellationToken) {
        let mut deadlines = self.deadline.subscribe();
        let halted = halt.cancelled();
        tokio::pin!(halted);
        loop {
            let current = *deadlines.borrow_and_update();
            tokio::select! {
                () = &mut halted => return,
                changed = deadlines.changed() => if changed.is_err() { return },
                () = sleep_until(current) => {
                    let Some((period, _)) = current else { continue };
                    let mut state = self.lock();
                    if let Some(change) = state.pacing.expired(period) {
                        self.apply(&mut state, change);
                    }
                    // Whatever happened, this deadline is spent.
                    self.deadline.send_if_modified(|d| {
                        let spent = *d == current;
                        if spent {
                            *d = None;
                        }
                        spent
                    });
                }
            }
        }
    }

    fn apply(&self, state: &mut State, change: Change) {
        let (bytes, deadline) = match change {
            Change::Lazy(period) => (LAZY_BYTES, Some((period, Instant::now() + LAZY_FOR))),
            Change::Eager => (1, None),
        };
        let set = match &self.socket {
            Some(socket) => set_low_water(socket, bytes),
            None => Err(std::io::Error::other("no socket")),
        };
        if let Err(e) = set {
            warn!(error = %e, "cannot set SO_RCVLOWAT on the publish connection: confirms are read eagerly from now on");
            state.broken = true;
            // Eager: either it was never set lazy, or it could not be set
            // back and the connection is going anyway.
            if let Change::Lazy(period) = change {
                state.pacing.expired(period);
            }
            self.deadline.send_replace(None);
            return;
        }
        self.deadline.send_replace(deadline);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sleeps until the deadline, or forever without one.
async fn sleep_until(deadline: Option<(u64, Instant)>) {
    match deadline {
        Some((_, at)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(target_os = "linux")]
fn set_low_water(socket: &OwnedFd, bytes: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let value: libc::c_int = bytes;
    // SAFETY: `socket` is an open descriptor owned by this pacer for the
    // call's duration; the option value is a c_int that outlives the call,
    // and its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_low_water(_: &OwnedFd, _: i32) -> std::io::Result<()> {
    Err(std::io::Error::other("lazy confirms need Linux"))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::Duration;

    /// A connected pair of TCP sockets on loopback.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    fn readable(s: &TcpStream) -> bool {
        let mut fds = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(s),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the call's duration.
        let n = unsafe { libc::poll(&raw mut fds, 1, 200) };
        n == 1 && fds.revents & libc::POLLIN != 0
    }

    #[test]
    fn a_lazy_socket_hides_a_few_confirms_until_it_is_eager_again() {
        let (client, mut server) = pair();
        let pacer = Pacer::new(Some(client.as_fd().try_clone_to_owned().unwrap()));
        let ticket = pacer.sent(false);
        assert!(ticket.late && pacer.is_lazy());
        server.write_all(&[0u8; 21]).unwrap();
        assert!(!readable(&client), "21 bytes woke a lazy socket");
        drop(ticket);
        assert!(!pacer.is_lazy());
        assert!(
            readable(&client),
            "the eager socket did not report its bytes"
        );
        let mut buf = [0u8; 64];
        assert_eq!((&client).read(&mut buf).unwrap(), 21);
    }

    #[test]
    fn an_urgent_publish_reads_what_waits() {
        let (client, mut server) = pair();
        let pacer = Pacer::new(Some(client.as_fd().try_clone_to_owned().unwrap()));
        let lazy = pacer.sent(false);
        server.write_all(&[0u8; 21]).unwrap();
        assert!(!readable(&client));
        let urgent = pacer.sent(true);
        assert!(!urgent.late && !pacer.is_lazy());
        assert!(readable(&client));
        drop((lazy, urgent));
    }

    #[tokio::test]
    async fn a_lazy_period_ends_at_its_deadline() {
        let (client, _server) = pair();
        let pacer = std::sync::Arc::new(Pacer::new(Some(
            client.as_fd().try_clone_to_owned().unwrap(),
        )));
        let halt = CancellationToken::new();
        let timer = tokio::spawn({
            let (pacer, halt) = (pacer.clone(), halt.clone());
            async move { pacer.run(halt).await }
        });
        let ticket = pacer.sent(false);
        assert!(pacer.is_lazy());
        tokio::time::sleep(LAZY_FOR + Duration::from_millis(200)).await;
        assert!(!pacer.is_lazy(), "still lazy past the deadline");
        // Eager until everything is confirmed: a second publish is not late.
        assert!(!pacer.sent(false).late);
        drop(ticket);
        halt.cancel();
        timer.await.unwrap();
    }

    #[test]
    fn without_a_socket_every_publish_is_eager() {
        let pacer = Pacer::new(None);
        let ticket = pacer.sent(false);
        assert!(!ticket.late && !pacer.is_lazy());
    }
}

//! Opening and closing connections and channels, each with a timeout.

use super::{BrokerError, CONNECT_TIMEOUT, RPC_TIMEOUT, timed};
use crate::config::{AmqpUrl, CaFile, redact_text};
use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream, OwnedTLSConfig};
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

/// The stream lapin's default (tokio) runtime connects with. Named so that
/// its socket can be reached, under lapin's `AsyncFn` connector as well as
/// under the patched one (the fuzz crate builds with upstream lapin).
type PlainStream = async_compat::Compat<tokio::net::TcpStream>;

/// Opens a connection named `name` (shown by `rabbitmqctl list_connections`).
pub async fn connect(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<Connection, BrokerError> {
    Ok(open(url, ca_file, name).await?.0)
}

/// Opens a connection and, when it is plain TCP, keeps a duplicate of its
/// socket's descriptor (closed when dropped): the publish connection's
/// [`Pacer`](crate::router::pacer::Pacer) tunes it.
async fn open(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<(Connection, Option<OwnedFd>), BrokerError> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: ca_file.map(|ca| ca.pem.clone()),
    };
    let failed = |message: String| BrokerError::Connect {
        url: url.to_string(),
        message,
    };
    let runtime = lapin::runtime::default_runtime().map_err(|e| failed(e.to_string()))?;
    let uri: AMQPUri = url
        .expose()
        .parse()
        .map_err(|e: String| failed(redact_text(&e)))?;
    let socket = Arc::new(Mutex::new(None));
    let kept = socket.clone();
    // What lapin's own `connect_with_config` does, keeping the socket.
    let connecting = Connection::connector(
        uri,
        runtime,
        move |uri: AMQPUri, runtime| {
            let (tls, kept) = (tls.clone(), kept.clone());
            async move {
                let stream: AsyncTcpStream<PlainStream> = uri
                    .connect_with_config_async(tls.as_ref(), &runtime)
                    .await?;
                if let AsyncTcpStream::Plain(plain) = &stream {
                    let fd = plain.get_ref().as_fd().try_clone_to_owned().ok();
                    *kept.lock().unwrap_or_else(PoisonError::into_inner) = fd;
                }
                Ok(stream)
            }
        },
        props,
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(c)) => {
            let fd = socket.lock().unwrap_or_else(PoisonError::into_inner).take();
            Ok((c, fd))
        }
        Ok(Err(e)) => Err(failed(redact_text(&e.to_string()))),
        Err(_) => Err(failed(format!("no answer within {CONNECT_TIMEOUT:?}"))),
    }
}

/// Opens a connection to the first of `urls` that answers, trying them in
/// order from `first` (wrapping around); returns it with the index of the
/// URL used. The error names every URL tried and why it failed.
pub async fn connect_any(
    urls: &[AmqpUrl],
    first: usize,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<(Connection, usize), BrokerError> {
    let (conn, used, _) = connect_any_with_socket(urls, first, ca_file, name).await?;
    Ok((conn, used))
}

/// [`connect_any`], with a duplicate of the socket's descriptor when the
/// connection is plain TCP.
pub async fn connect_any_with_socket(
    urls: &[AmqpUrl],
    first: usize,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<(Connection, usize, Option<OwnedFd>), BrokerError> {
    if let [only] = urls {
        let (conn, fd) = open(only, ca_file, name).await?;
        return Ok((conn, 0, fd));
    }
    let mut failures = Vec::new();
    for k in 0..urls.len() {
        let i = (first + k) % urls.len();
        match open(&urls[i], ca_file, name).await {
            Ok((conn, fd)) => return Ok((conn, i, fd)),
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(BrokerError::Connect {
        url: format!("any of {} nodes", urls.len()),
        message: failures.join("; "),
    })
}

/// Opens a channel.
pub async fn channel(conn: &Connection) -> Result<Channel, BrokerError> {
    timed("channel.open", RPC_TIMEOUT, conn.create_channel()).await
}

/// Closes a channel that is still open; what it held unacked goes back to
/// its queue. Best effort: a channel the broker closed is already gone.
pub async fn close_channel(ch: &Channel, why: &str) {
    if ch.status().connected() {
        let _ = timed("channel.close", RPC_TIMEOUT, ch.close(200, why.into())).await;
    }
}

/// Closes a connection, best effort.
pub async fn close_connection(conn: &Connection, why: &str) {
    let _ = timed("connection.close", RPC_TIMEOUT, conn.close(200, why.into())).await;
}

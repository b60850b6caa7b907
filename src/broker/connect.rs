//! Opening and closing connections and channels, each with a timeout.

use super::{BrokerError, CONNECT_TIMEOUT, RPC_TIMEOUT, timed};
use crate::config::{AmqpUrl, CaFile, redact_text};
use lapin::tcp::OwnedTLSConfig;
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};

/// Opens a connection named `name` (shown by `rabbitmqctl list_connections`).
pub async fn connect(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<Connection, BrokerError> {
    open(url, ca_file, name).await
}

/// Opens one connection to `url`.
async fn open(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<Connection, BrokerError> {
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
    let connecting = Connection::connect_uri_with_config(uri, props, tls, runtime);
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(failed(redact_text(&e.to_string()))),
        Err(_) => Err(failed(format!("no answer within {CONNECT_TIMEOUT:?}"))),
    }
}

pub async fn connect_any(
    urls: &[AmqpUrl],
    first: usize,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<(Connection, usize), BrokerError> {
    if let [only] = urls {
        return Ok((open(only, ca_file, name).await?, 0));
    }
    let mut failures = Vec::new();
    for k in 0..urls.len() {
        let i = (first + k) % urls.len();
        match open(&urls[i], ca_file, name).await {
            Ok(conn) => return Ok((conn, i)),
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

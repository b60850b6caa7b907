//! What a broker says of itself when a connection opens: product, version
//! and cluster name (AMQP's `server-properties`). lapin does not keep them,
//! so the router reads them on a short connection of its own: the AMQP
//! handshake (start, PLAIN credentials, tune, open) and a clean close, so
//! the broker logs an ordinary connection, not a broken one.

use super::{BrokerError, CONNECT_TIMEOUT};
use crate::config::{AmqpUrl, CaFile, redact_text};
use amq_protocol::frame::{AMQPFrame, ProtocolVersion, gen_frame, parse_frame};
use amq_protocol::protocol::{AMQPClass, connection};
use lapin::tcp::{AMQPUriTcpExt, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::fmt;
use std::io::{Read, Write};
use std::str::FromStr;

/// The broker as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `RabbitMQ`.
    pub product: String,
    /// `3.10.8`, `4.3.6`.
    pub version: String,
    pub cluster_name: Option<String>,
}

impl ServerInfo {
    /// The version's major and minor numbers, when it reads as `M.m...`.
    pub fn major_minor(&self) -> Option<(u32, u32)> {
        let mut parts = self.version.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts
            .next()?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        Some((major, minor))
    }

    /// Whether this is RabbitMQ `major.minor` or later.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        self.major_minor().is_some_and(|v| v >= (major, minor))
    }

    fn from_properties(p: &FieldTable) -> Self {
        let text = |key: &str| match p.inner().get(key) {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
            _ => None,
        };
        Self {
            product: text("product").unwrap_or_else(|| "unknown".into()),
            version: text("version").unwrap_or_else(|| "unknown".into()),
            cluster_name: text("cluster_name"),
        }
    }
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.product, self.version)?;
        if let Some(c) = &self.cluster_name {
            write!(f, " (cluster {c})")?;
        }
        Ok(())
    }
}

/// Reads the broker's server properties at `url`.
pub async fn server_info(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
) -> Result<ServerInfo, BrokerError> {
    let failed = |message: String| BrokerError::Connect {
        url: url.to_string(),
        message,
    };
    let uri = lapin::uri::AMQPUri::from_str(url.expose()).map_err(failed)?;
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: ca_file.map(|ca| ca.pem.clone()),
    };
    let handshake = tokio::task::spawn_blocking(move || handshake(&uri, &tls));
    match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
        Ok(Ok(Ok(info))) => Ok(info),
        Ok(Ok(Err(e))) => Err(failed(redact_text(&e))),
        Ok(Err(join)) => Err(failed(join.to_string())),
        Err(_) => Err(failed(format!("no answer within {CONNECT_TIMEOUT:?}"))),
    }
}

fn handshake(uri: &lapin::uri::AMQPUri, tls: &OwnedTLSConfig) -> Result<ServerInfo, String> {
    let stream = uri
        .connect_with_config(tls.as_ref())
        .map_err(|e| e.to_string())?;
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut conn = Frames {
        stream,
        buf: Vec::new(),
    };
    conn.send(&AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1()))?;
    let AMQPClass::Connection(connection::AMQPMethod::Start(start)) = conn.method()? else {
        return Err("the broker did not start the AMQP handshake".into());
    };
    let info = ServerInfo::from_properties(&start.server_properties);
    let user = &uri.authority.userinfo;
    let mut client = FieldTable::default();
    client.insert(
        "connection_name".into(),
        AMQPValue::LongString("delay-router probe".into()),
    );
    let response = format!("\0{}\0{}", user.username, user.password);
    conn.send(&method(connection::AMQPMethod::StartOk(
        connection::StartOk {
            client_properties: client,
            mechanism: "PLAIN".into(),
            response: LongString::from(response),
            locale: "en_US".into(),
        },
    )))?;
    let AMQPClass::Connection(connection::AMQPMethod::Tune(tune)) = conn.method()? else {
        return Err("the broker refused the credentials".into());
    };
    conn.send(&method(connection::AMQPMethod::TuneOk(
        connection::TuneOk {
            channel_max: tune.channel_max,
            frame_max: tune.frame_max,
            heartbeat: 0,
        },
    )))?;
    conn.send(&method(connection::AMQPMethod::Open(connection::Open {
        virtual_host: uri.vhost.as_str().into(),
    })))?;
    let AMQPClass::Connection(connection::AMQPMethod::OpenOk(_)) = conn.method()? else {
        return Err(format!("the broker refused virtual host '{}'", uri.vhost));
    };
    conn.send(&method(connection::AMQPMethod::Close(connection::Close {
        reply_code: 200,
        reply_text: "bye".into(),
        class_id: 0,
        method_id: 0,
    })))?;
    let _ = conn.method();
    Ok(info)
}

fn method(m: connection::AMQPMethod) -> AMQPFrame {
    AMQPFrame::Method(0, AMQPClass::Connection(m))
}

/// Frames over a blocking stream.
struct Frames<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: Read + Write> Frames<S> {
    fn send(&mut self, frame: &AMQPFrame) -> Result<(), String> {
        let bytes =
            cookie_factory::gen_simple(gen_frame(frame), Vec::new()).map_err(|e| e.to_string())?;
        self.stream.write_all(&bytes).map_err(|e| e.to_string())
    }

    /// The next method frame on channel 0 (heartbeats skipped).
    fn method(&mut self) -> Result<AMQPClass, String> {
        loop {
            match parse_frame(self.buf.as_slice()) {
                Ok((rest, frame)) => {
                    let used = self.buf.len() - rest.len();
                    self.buf.drain(..used);
                    if let AMQPFrame::Method(0, m) = frame {
                        return Ok(m);
                    }
                }
                Err(e) if e.is_incomplete() => {
                    let mut chunk = [0u8; 4096];
                    let n = self.stream.read(&mut chunk).map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Err("the broker closed the connection".into());
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) => return Err(format!("unreadable frame: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str) -> ServerInfo {
        ServerInfo {
            product: "RabbitMQ".into(),
            version: version.into(),
            cluster_name: None,
        }
    }

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert_eq!(info("4.3.6").major_minor(), Some((4, 3)));
        assert!(info("4.3.6").at_least(4, 3));
        assert!(info("4.10.0").at_least(4, 3));
        assert!(!info("3.10.8").at_least(4, 0));
        assert!(!info("unknown").at_least(3, 0));
        assert_eq!(info("4.0.0-rc.1").major_minor(), Some((4, 0)));
    }
}

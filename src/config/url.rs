//! The AMQP URL and TLS trust: parsed once; the password never appears in
//! what the router shows (`Display`, errors, logs).

use lapin::uri::AMQPUri;
use std::{fmt, str::FromStr};

/// The AMQP URL, parsed; its `Display` never shows the password.
#[derive(Clone)]
pub struct AmqpUrl {
    raw: String,
    uri: AMQPUri,
}

impl AmqpUrl {
    /// Parses a URL; the error never repeats the password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let uri = AMQPUri::from_str(raw)
            .map_err(|_| format!("not a valid amqp:// or amqps:// URL ({})", redact(raw)))?;
        Ok(Self {
            raw: raw.to_owned(),
            uri,
        })
    }
    /// The full URL, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.raw
    }
    /// Whether the URL asks for TLS (`amqps://`).
    pub fn is_tls(&self) -> bool {
        self.uri.scheme == lapin::uri::AMQPScheme::AMQPS
    }
    /// The user name the router authenticates as.
    pub fn username(&self) -> &str {
        &self.uri.authority.userinfo.username
    }
    /// The virtual host.
    pub fn vhost(&self) -> &str {
        &self.uri.vhost
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.raw))
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmqpUrl({self})")
    }
}

/// Replaces the password of a URL (`scheme://user:password@host`) with `***`.
pub fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let rest = &raw[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &raw[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => raw.to_owned(),
    }
}

/// A CA certificate (PEM) trusted for `amqps://`, besides the system's roots.
#[derive(Clone)]
pub struct CaFile {
    pub path: String,
    pub pem: String,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFile({})", self.path)
    }
}

impl CaFile {
    /// Reads and checks a PEM file of certificates.
    pub fn read(path: &str) -> Result<Self, String> {
        let pem = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err("expected PEM certificates (-----BEGIN CERTIFICATE-----)".into());
        }
        Ok(Self {
            path: path.to_owned(),
            pem,
        })
    }
}

/// Redacts anything that looks like a URL with a password inside free text.
pub fn redact_text(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

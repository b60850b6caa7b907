//! Security: which destinations the router may deliver to, and the least
//! privileges its broker user needs. Pure.
//!
//! Whoever may publish to the router exchange can have a message delivered,
//! after a delay, to any exchange the router's user may write. The
//! allow-list narrows that to the exchanges named in
//! `[security] allow_destinations`; the broker permissions printed by
//! `delay-router permissions` narrow what the router's user can do at all.

use crate::core::delayed::DelayedExchange;
use crate::core::glob::glob_match;
use crate::core::topology::Names;
use lapin::types::ShortString;
use std::fmt;

/// `[security] allow_destinations`: globs (`*` any run, `?` one character)
/// over destination exchange names; `""` is the default exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    patterns: Vec<String>,
}

/// Why an allow-list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    #[error(
        "an empty list allows no destination; remove the key to allow every exchange the router's user may write"
    )]
    Empty,
    #[error("pattern \"{0}\" is longer than an exchange name can be (255 bytes)")]
    TooLong(String),
}

impl AllowList {
    /// Validates the patterns.
    pub fn new(patterns: Vec<String>) -> Result<Self, AllowListError> {
        if patterns.is_empty() {
            return Err(AllowListError::Empty);
        }
        if let Some(p) = patterns.iter().find(|p| p.len() > 255) {
            return Err(AllowListError::TooLong(p.clone()));
        }
        Ok(Self { patterns })
    }

    /// Whether a message may be delivered to `exchange`.
    pub fn allows(&self, exchange: &str) -> bool {
        self.patterns.iter().any(|p| glob_match(p, exchange))
    }

    /// The patterns as configured.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted: Vec<String> = self.patterns.iter().map(|p| format!("{p:?}")).collect();
        write!(f, "[{}]", quoted.join(", "))
    }
}

/// A glob as an anchored-free regular expression fragment for RabbitMQ's
/// permission patterns: `*` becomes `.*`, `?` becomes `.`, the rest is escaped.
pub fn glob_to_regex(glob: &str) -> String {
    let mut out = String::with_capacity(glob.len() * 2);
    for c in glob.chars() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => out.push(c),
            c if c.is_ascii() => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Stands for the destination exchanges in the router's write pattern when
/// no allow-list names them.
pub const UNLISTED_DESTINATIONS: &str = "YOUR-DESTINATION-EXCHANGES";

/// `name` as a regex that matches exactly it.
fn regex_literal(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The configure / write / read patterns of a broker user (`rabbitmqctl
/// set_permissions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    pub configure: String,
    pub write: String,
    pub read: String,
}

impl Permissions {
    /// What the router's user needs: configure and read on its own names
    /// (declare, bind, consume, get, delete retired buckets), write on the
    /// queues it binds (`ingress`, `expired`, its presence queue; `due`, an
    /// earlier version's due lane, which it unbinds), on
    /// the exchanges it binds (`lanes`, to `expired`) or names as an
    /// alternate exchange (`lanes.later`), on the presence exchange, on the default exchange (it places, parks and
    /// records state through it), and on the destinations
    /// the allow-list names. Without an allow-list the destinations are the
    /// operator's to list: the pattern then names [`UNLISTED_DESTINATIONS`].
    pub fn router(names: &Names, allow: Option<&AllowList>) -> Self {
        let own = format!("^{}\\.", glob_to_regex(&names.prefix));
        let mut write = vec![
            format!(
                "{}\\.(ingress|expired|due|lanes|lanes\\.later|presence|presence\\..*)",
                glob_to_regex(&names.prefix)
            ),
            "amq\\.default".to_owned(),
        ];
        match allow {
            Some(allow) => write.extend(
                allow
                    .patterns()
                    .iter()
                    .filter(|p| !p.is_empty())
                    .map(|p| glob_to_regex(p)),
            ),
            None => write.push(UNLISTED_DESTINATIONS.to_owned()),
        }
        Self {
            configure: own.clone(),
            write: format!("^({})$", write.join("|")),
            read: own,
        }
    }

    /// The same permissions with the plugin's exchanges the router serves:
    /// for the router's user, configure on each and its delivery exchange
    /// (it declares them), read on each (it binds its ingress to them) and
    /// write on each delivery exchange (it delivers there); for a
    /// publisher (`router == false`), write on each plugin exchange.
    pub fn with_delayed(mut self, delayed: &[DelayedExchange], router: bool) -> Self {
        if delayed.is_empty() {
            return self;
        }
        let literal = |n: &ShortString| regex_literal(n.as_str());
        let widen = |pattern: &mut String, names: Vec<String>| {
            let mut alternatives = names;
            if !pattern.is_empty() {
                alternatives.insert(0, format!("(?:{pattern})"));
            }
            *pattern = alternatives.join("|");
        };
        let exact = |names: Vec<String>| names.iter().map(|n| format!("^{n}$")).collect();
        if router {
            let both = delayed
                .iter()
                .flat_map(|x| [literal(&x.name), literal(&x.deliver_to)])
                .collect();
            widen(&mut self.configure, exact(both));
            widen(
                &mut self.read,
                exact(delayed.iter().map(|x| literal(&x.name)).collect()),
            );
            widen(
                &mut self.write,
                exact(delayed.iter().map(|x| literal(&x.deliver_to)).collect()),
            );
        } else {
            widen(
                &mut self.write,
                exact(delayed.iter().map(|x| literal(&x.name)).collect()),
            );
        }
        self
    }

    /// What a publisher needs: write on the router exchange, nothing else.
    pub fn publisher(names: &Names) -> Self {
        Self {
            configure: String::new(),
            write: format!("^{}$", glob_to_regex(names.router_exchange.as_str())),
            read: String::new(),
        }
    }

    /// What a user who may cancel needs (`delay-router cancel`, or a cancel
    /// request published by an application): write on the control exchange,
    /// nothing else. Granted apart from [`Permissions::publisher`], so that
    /// whoever may delay a message cannot remove another's.
    pub fn controller(names: &Names) -> Self {
        Self {
            configure: String::new(),
            write: format!("^{}$", glob_to_regex(names.control.as_str())),
            read: String::new(),
        }
    }

    /// The `rabbitmqctl` command that grants these to `user` on `vhost`.
    pub fn command(&self, vhost: &str, user: &str) -> String {
        format!(
            "rabbitmqctl set_permissions -p {} {} {} {} {}",
            shell_quote(vhost),
            shell_quote(user),
            shell_quote(&self.configure),
            shell_quote(&self.write),
            shell_quote(&self.read)
        )
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use crate::core::delayed::{DelayedExchange, DelayedType};

    #[test]
    fn the_plugins_exchanges_widen_exactly_what_each_user_needs() {
        let names = Names::new("delay");
        let delayed = [DelayedExchange {
            name: "orders.delayed".into(),
            kind: DelayedType::Topic,
            deliver_to: "orders.delayed.delivered".into(),
        }];
        let router = Permissions::router(&names, None).with_delayed(&delayed, true);
        let re = |p: &str| {
            let r = regex::Regex::new(p).unwrap();
            move |name: &str| r.is_match(name)
        };
        assert!(re(&router.configure)("orders.delayed"));
        assert!(re(&router.configure)("orders.delayed.delivered"));
        assert!(re(&router.configure)("delay.bucket.1s"));
        assert!(!re(&router.configure)("orders.delayedX"));
        assert!(re(&router.read)("orders.delayed"));
        assert!(!re(&router.read)("orders.delayed.delivered"));
        assert!(re(&router.write)("orders.delayed.delivered"));
        assert!(!re(&router.write)("orders.delayed"));
        let publisher = Permissions::publisher(&names).with_delayed(&delayed, false);
        assert!(re(&publisher.write)("orders.delayed"));
        assert!(re(&publisher.write)("delay.router"));
        assert!(!re(&publisher.write)("orders.delayed.delivered"));
        assert_eq!(publisher.configure, "");
        assert_eq!(
            Permissions::publisher(&names).with_delayed(&[], false),
            Permissions::publisher(&names)
        );
    }
    use super::*;

    fn list(p: &[&str]) -> AllowList {
        AllowList::new(p.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    #[test]
    fn globs_allow_exchange_names_and_the_empty_pattern_the_default_exchange() {
        let l = list(&["orders", "billing.*", ""]);
        assert!(l.allows("orders"));
        assert!(l.allows("billing.eu"));
        assert!(l.allows(""));
        assert!(!l.allows("orders.eu"));
        assert!(!l.allows("amq.rabbitmq.trace"));
        assert!(!list(&["orders"]).allows(""));
        assert_eq!(AllowList::new(vec![]), Err(AllowListError::Empty));
        assert_eq!(l.to_string(), "[\"orders\", \"billing.*\", \"\"]");
    }

    #[test]
    fn router_permissions_cover_its_names_the_default_exchange_and_the_allowed_destinations() {
        let names = Names::new("delay");
        let p = Permissions::router(&names, Some(&list(&["orders", "billing.*", ""])));
        assert_eq!(p.configure, "^delay\\.");
        assert_eq!(p.read, "^delay\\.");
        assert_eq!(
            p.write,
            "^(delay\\.(ingress|expired|due|lanes|lanes\\.later|presence|presence\\..*)|amq\\.default|orders|billing\\..*)$"
        );
        assert!(
            Permissions::router(&names, None)
                .write
                .contains(UNLISTED_DESTINATIONS)
        );
        assert_eq!(Permissions::publisher(&names).write, "^delay\\.router$");
        assert_eq!(
            Permissions::publisher(&names).command("/", "app"),
            "rabbitmqctl set_permissions -p '/' 'app' '' '^delay\\.router$' ''"
        );
    }

    #[test]
    fn glob_to_regex_escapes_what_regex_reads_specially() {
        assert_eq!(glob_to_regex("a.b*c?"), "a\\.b.*c.");
        assert_eq!(glob_to_regex("x+(y)"), "x\\+\\(y\\)");
        assert_eq!(glob_to_regex("drt-1f:q"), "drt-1f\\:q");
    }
}

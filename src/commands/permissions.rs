//! `delay-router permissions`: the `rabbitmqctl` commands that give the
//! router's user and the publishers the least privileges they need.

use crate::config::Config;
use crate::core::security::Permissions;
use crate::core::topology::Names;

/// One commented `rabbitmqctl set_permissions` command per user: the
/// router's, a publisher's and a controller's (who may cancel).
pub fn report(config: &Config, publisher: &str, controller: &str) -> String {
    let names = Names::new(&config.prefix);
    let vhost = config.url.vhost();
    let delayed = &config.delayed_exchanges;
    let router =
        Permissions::router(&names, config.allow_destinations.as_ref()).with_delayed(delayed, true);
    let mut out = String::from(
        "# The router's user: configure and read its own names; write the queues it binds,\n\
         # the default exchange (buckets, park, state) and the destinations it serves.\n",
    );
    if config.allow_destinations.is_none() {
        out.push_str(
            "# [security] allow_destinations is unset: replace YOUR-DESTINATION-EXCHANGES\n\
             # with the exchanges the router delivers to (a regex alternation).\n",
        );
    }
    out.push_str(&router.command(vhost, config.url.username()));
    out.push_str("\n# Each publisher: write on the router exchange");
    out.push_str(if delayed.is_empty() {
        ", nothing else.\n"
    } else {
        " and on the plugin exchanges ([[delayed_exchange]]).\n"
    });
    out.push_str(
        &Permissions::publisher(&names)
            .with_delayed(delayed, false)
            .command(vhost, publisher),
    );
    out.push_str(
        "\n# Whoever may cancel (delay-router cancel, x-cancel-message-id): write on the\n\
         # control exchange, nothing else. A publisher without it cannot cancel.\n",
    );
    out.push_str(&Permissions::controller(&names).command(vhost, controller));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_both_users_and_asks_for_destinations_when_unlisted() {
        let shipped = Config::from_toml(include_str!("../../buckets.toml")).unwrap();
        let text = report(&shipped, "app", "ops");
        assert!(
            text.contains("rabbitmqctl set_permissions -p '/' 'guest' '^delay\\.'"),
            "{text}"
        );
        assert!(text.contains("YOUR-DESTINATION-EXCHANGES"), "{text}");
        assert!(text.contains("'app' '' '^delay\\.router$' ''"), "{text}");
        assert!(text.contains("'ops' '' '^delay\\.control$' ''"), "{text}");
        let listed = Config::from_toml(
            "[security]\nallow_destinations = [\"orders\", \"\"]\n[[bucket]]\nttl = \"1s\"",
        )
        .unwrap();
        let text = report(&listed, "app", "ops");
        assert!(!text.contains("YOUR-DESTINATION-EXCHANGES"), "{text}");
        assert!(text.contains("|orders)$'"), "{text}");
    }
}

//! Decisions: what the router does with a message arriving at ingress or
//! expiring from a bucket. Pure functions of the message, the plan and the clock.

use crate::contract::{self, Destination, REQUESTED_DELAY};
use crate::envelope::{self, Overrides, Transit};
use crate::ladder::Ladder;
use crate::park::ParkReason;
use crate::placement::{self, Placement, Strategy};
use crate::topology::Names;
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use std::time::Duration;

/// Everything a decision depends on besides the message and the clock.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The strategy's effective ladder (cascade adds finer rungs).
    pub ladder: Ladder,
    pub strategy: Strategy,
    pub names: Names,
    /// The AMQP user the router publishes as; RabbitMQ rejects a `user-id` property that differs.
    pub router_user: String,
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish to a bucket queue (default exchange, routing key = queue).
    Wait {
        queue: ShortString,
        ttl: Duration,
        properties: BasicProperties,
    },
    /// Publish to the destination, `mandatory`, with the sender's properties,
    /// after holding it `after` (cascade's last fraction; zero otherwise).
    Deliver {
        destination: Destination,
        properties: BasicProperties,
        after: Duration,
    },
    /// Publish to the parking queue.
    Park {
        reason: ParkReason,
        properties: BasicProperties,
    },
}

impl Plan {
    /// The plan for a configured ladder and strategy.
    pub fn new(ladder: &Ladder, strategy: Strategy, prefix: &str, router_user: &str) -> Self {
        Self {
            ladder: placement::effective_ladder(strategy, ladder),
            strategy,
            names: Names::new(prefix),
            router_user: router_user.to_owned(),
        }
    }

    /// The bucket queues this plan uses, with their declare arguments.
    pub fn bucket_queues(&self) -> Vec<(ShortString, FieldTable)> {
        self.names
            .buckets(self.strategy, &self.ladder)
            .map(|(q, rung)| {
                (
                    q,
                    crate::topology::bucket_arguments(&self.names, self.strategy, rung),
                )
            })
            .collect()
    }

    /// A message published to the router exchange.
    pub fn on_ingress(
        &self,
        routing_key: &ShortString,
        p: &BasicProperties,
        now_ms: i64,
    ) -> Action {
        match self.admit(routing_key, p, now_ms) {
            Ok(transit) => self.schedule(p, transit, now_ms, true),
            Err((reason, destination)) => Action::Park {
                properties: envelope::park(p, &reason, now_ms, destination.as_ref()),
                reason,
            },
        }
    }

    fn admit(
        &self,
        routing_key: &ShortString,
        p: &BasicProperties,
        now_ms: i64,
    ) -> Result<Transit, (ParkReason, Option<Destination>)> {
        let empty = FieldTable::default();
        let headers = p.headers().as_ref().unwrap_or(&empty);
        let destination = contract::requested_destination(headers, routing_key)
            .map_err(|e| (ParkReason::InvalidDestination(e), None))?;
        let park = |reason| (reason, Some(destination.clone()));
        if destination.exchange.as_str() == self.names.router_exchange.as_str() {
            return Err(park(ParkReason::DestinationIsRouter(
                destination.exchange.to_string(),
            )));
        }
        if let Some(user_id) = p.user_id()
            && user_id.as_str() != self.router_user
        {
            return Err(park(ParkReason::UserIdMismatch {
                user_id: user_id.to_string(),
                router_user: self.router_user.clone(),
            }));
        }
        let delay = match headers.inner().get(REQUESTED_DELAY) {
            None => return Err(park(ParkReason::MissingDelay)),
            Some(v) => contract::parse_delay(v).map_err(|e| park(ParkReason::InvalidDelay(e)))?,
        };
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        Ok(Transit {
            destination,
            deadline_ms: now_ms.saturating_add(delay_ms),
            hops: 0,
        })
    }

    /// Places a message with `transit` in a bucket, or delivers it when due.
    fn schedule(
        &self,
        p: &BasicProperties,
        mut transit: Transit,
        now_ms: i64,
        entering: bool,
    ) -> Action {
        let remaining = Duration::from_millis(
            u64::try_from(transit.deadline_ms.saturating_sub(now_ms)).unwrap_or(0),
        );
        let deliver = |after| Action::Deliver {
            properties: if entering {
                p.clone()
            } else {
                envelope::leave_transit(p)
            },
            destination: transit.destination.clone(),
            after,
        };
        match placement::place(self.strategy, &self.ladder, remaining) {
            None => deliver(Duration::ZERO),
            Some(Placement::Hold(after)) => deliver(after),
            Some(Placement::Bucket {
                rung,
                expiration,
                priority,
            }) => {
                transit.hops += 1;
                let rung = &self.ladder.rungs()[rung];
                let o = Overrides {
                    expiration,
                    priority,
                };
                let properties = if entering {
                    envelope::enter_transit(p, &transit, o)
                } else {
                    envelope::next_hop(p, &transit, o)
                };
                Action::Wait {
                    queue: self.names.bucket(self.strategy, rung),
                    ttl: rung.ttl,
                    properties,
                }
            }
        }
    }

    /// A message a bucket dead-lettered into the router's expired queue.
    pub fn on_expired(&self, p: &BasicProperties, now_ms: i64) -> Action {
        match envelope::read_transit(p) {
            Ok(transit) => self.schedule(p, transit, now_ms, false),
            Err(e) => {
                let reason = ParkReason::NotInTransit(e.to_string());
                Action::Park {
                    properties: envelope::park(p, &reason, now_ms, None),
                    reason,
                }
            }
        }
    }

    /// A message whose delivery failed at the destination: parked with the
    /// sender's properties restored.
    pub fn on_delivery_failed(
        &self,
        delivered: &BasicProperties,
        destination: &Destination,
        reason: ParkReason,
        now_ms: i64,
    ) -> Action {
        Action::Park {
            properties: envelope::park(delivered, &reason, now_ms, Some(destination)),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY};
    use crate::envelope::read_transit;
    use lapin::types::AMQPValue;

    fn plan() -> Plan {
        plan_for(Strategy::RoundUp)
    }

    fn plan_for(strategy: Strategy) -> Plan {
        Plan::new(
            &Ladder::from_labels(&["1s", "2s", "5s"]).unwrap(),
            strategy,
            "t",
            "guest",
        )
    }

    fn props(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut h = FieldTable::default();
        for (k, v) in pairs {
            h.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(h)
    }

    fn s(v: &str) -> AMQPValue {
        AMQPValue::LongString(v.into())
    }

    const NOW: i64 = 1_000_000;

    #[test]
    fn ingress_places_in_the_round_up_bucket_with_a_deadline() {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(1500)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        let Action::Wait {
            queue,
            ttl,
            properties,
        } = plan().on_ingress(&"eu".into(), &p, NOW)
        else {
            panic!("expected a bucket")
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        assert_eq!(ttl, Duration::from_secs(2));
        let t = read_transit(&properties).unwrap();
        assert_eq!(t.deadline_ms, NOW + 1500);
        assert_eq!(
            (
                t.destination.exchange.as_str(),
                t.destination.routing_key.as_str()
            ),
            ("orders", "eu")
        );
    }

    #[test]
    fn expiry_before_the_deadline_goes_round_again_and_after_it_delivers() {
        let p = props(&[
            ("x-requested-delay", s("7s")),
            (ORIGINAL_EXCHANGE, s("")),
            (ORIGINAL_ROUTING_KEY, s("jobs")),
        ]);
        let plan = plan();
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"x".into(), &p, NOW)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.5s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 5_000)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        assert_eq!(read_transit(&properties).unwrap().hops, 2);
        let Action::Deliver {
            destination,
            properties,
            after,
        } = plan.on_expired(&properties, NOW + 7_000)
        else {
            panic!()
        };
        assert_eq!(after, Duration::ZERO);
        assert_eq!(destination.routing_key.as_str(), "jobs");
        assert_eq!(properties, p);
    }

    #[test]
    fn zero_delay_delivers_at_once_unchanged() {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(0)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        assert!(
            matches!(plan().on_ingress(&"eu".into(), &p, NOW), Action::Deliver { properties, .. } if properties == p)
        );
    }

    #[test]
    fn cascade_goes_down_the_ladder_and_holds_the_last_fraction() {
        let plan = plan_for(Strategy::Cascade);
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(3_400)),
            (ORIGINAL_EXCHANGE, s("o")),
        ]);
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"k".into(), &p, NOW)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 2_003)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.1s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 3_010)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.250ms");
        let Action::Deliver {
            after, properties, ..
        } = plan.on_expired(&properties, NOW + 3_262)
        else {
            panic!()
        };
        assert_eq!(after, Duration::from_millis(138));
        assert_eq!(properties, p);
        // Finer rungs below 1s: 500ms, 250ms.
        let Action::Wait { queue, .. } = plan.on_ingress(
            &"k".into(),
            &props(&[
                ("x-requested-delay", AMQPValue::LongInt(700)),
                (ORIGINAL_EXCHANGE, s("o")),
            ]),
            NOW,
        ) else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.500ms");
    }

    /// The README's example: 100 s on the shipped ladder.
    #[test]
    fn cascade_on_the_shipped_ladder_matches_the_documented_example() {
        let shipped = crate::config::Config::from_toml(include_str!("../buckets.toml")).unwrap();
        let plan = Plan::new(&shipped.ladder, Strategy::Cascade, "delay", "guest");
        let p = props(&[
            ("x-requested-delay", s("100s")),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        let (mut action, mut now, mut path) = (plan.on_ingress(&"k".into(), &p, NOW), NOW, vec![]);
        while let Action::Wait {
            queue,
            ttl,
            properties,
        } = action
        {
            path.push(queue.to_string());
            now += ttl.as_millis() as i64;
            action = plan.on_expired(&properties, now);
        }
        assert_eq!(
            path,
            [
                "delay.bucket.1m",
                "delay.bucket.30s",
                "delay.bucket.7500ms",
                "delay.bucket.1875ms",
                "delay.bucket.468ms"
            ]
        );
        assert!(
            matches!(action, Action::Deliver { after, .. } if after == Duration::from_millis(157))
        );
    }

    #[test]
    fn priority_sets_expiration_and_priority_and_restores_the_sender_values() {
        let plan = plan_for(Strategy::Priority);
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(1_200)),
            (ORIGINAL_EXCHANGE, s("o")),
        ])
        .with_priority(1);
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"k".into(), &p, NOW)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.pbucket.2s");
        assert_eq!(properties.expiration().as_ref().unwrap().as_str(), "1200");
        assert_eq!(*properties.priority(), Some(7));
        let Action::Deliver { properties, .. } =
            plan.on_expired(&properties.with_expiration("0".into()), NOW + 1_200)
        else {
            panic!()
        };
        assert_eq!(properties.priority(), &Some(1));
    }

    fn park_reason(p: &BasicProperties) -> ParkReason {
        match plan().on_ingress(&"rk".into(), p, NOW) {
            Action::Park { reason, .. } => reason,
            other => panic!("expected park, got {other:?}"),
        }
    }

    #[test]
    fn bad_input_is_parked_with_a_reason() {
        assert_eq!(
            park_reason(&props(&[(ORIGINAL_EXCHANGE, s("o"))])),
            ParkReason::MissingDelay
        );
        assert!(matches!(
            park_reason(&props(&[
                (ORIGINAL_EXCHANGE, s("o")),
                ("x-requested-delay", s("-3"))
            ])),
            ParkReason::InvalidDelay(_)
        ));
        assert!(matches!(
            park_reason(&props(&[("x-requested-delay", s("3s"))])),
            ParkReason::InvalidDestination(_)
        ));
        assert!(matches!(
            park_reason(&props(&[
                ("x-requested-delay", s("3s")),
                (ORIGINAL_EXCHANGE, s("t.router"))
            ])),
            ParkReason::DestinationIsRouter(_)
        ));
        let p = props(&[("x-requested-delay", s("3s")), (ORIGINAL_EXCHANGE, s("o"))])
            .with_user_id("mallory".into());
        assert!(matches!(park_reason(&p), ParkReason::UserIdMismatch { .. }));
        assert!(matches!(
            park_reason(&BasicProperties::default()),
            ParkReason::InvalidDestination(_)
        ));
    }

    #[test]
    fn expired_without_transit_headers_is_parked() {
        assert!(matches!(
            plan().on_expired(&BasicProperties::default(), NOW),
            Action::Park {
                reason: ParkReason::NotInTransit(_),
                ..
            }
        ));
    }
}

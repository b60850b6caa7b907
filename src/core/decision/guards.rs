//! Guards on what the router publishes: a destination it may deliver to,
//! properties the broker takes from its user, a header that fits one frame.
//! Every decision passes through them.

use super::{Action, Rules};
use crate::core::contract::Destination;
use crate::core::envelope;
use crate::core::parking;
use crate::core::reasons::{ParkReason, exchange_label};
use crate::core::wire;
use lapin::BasicProperties;

impl Rules {
    /// Whether the router may deliver to `d`: not one of its own exchanges
    /// or queues (that would loop, or corrupt its state), and within the
    /// allow-list when there is one.
    pub fn check_destination(&self, d: &Destination) -> Result<(), ParkReason> {
        let (exchange, key) = (d.exchange.as_str(), d.routing_key.as_str());
        let names = &self.names;
        if exchange == names.router_exchange.as_str() {
            return Err(ParkReason::DestinationIsRouter(exchange.to_owned()));
        }
        if names
            .own_exchanges()
            .iter()
            .any(|own| own.as_str() == exchange)
        {
            return Err(ParkReason::OwnDestination {
                kind: "exchange",
                name: exchange.to_owned(),
            });
        }
        if exchange.is_empty() && names.owns_queue(key) {
            return Err(ParkReason::OwnDestination {
                kind: "queue",
                name: key.to_owned(),
            });
        }
        // A plugin exchange's delivery exchange is the configuration's
        // choice, not the sender's.
        let configured = self
            .delayed
            .iter()
            .any(|x| x.deliver_to.as_str() == exchange);
        match &self.allow {
            Some(allow) if !configured && !allow.allows(exchange) => Err(ParkReason::NotAllowed {
                exchange: exchange_label(exchange).to_owned(),
                allowed: allow.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// `action` if the broker will take it from the router, else its message
    /// parked with the reason: the destination must pass
    /// [`Rules::check_destination`] and the properties [`wire::acceptable`].
    /// A message that came out of a bucket may carry anything (someone may
    /// have published it there by hand), so this guards every decision.
    pub(super) fn publishable(&self, action: Action, now_ms: i64) -> Action {
        let acceptable = |p| {
            wire::acceptable(p, &self.router_user)
                .err()
                .map(ParkReason::Unacceptable)
        };
        let refusal = match &action {
            Action::Park { .. } | Action::Cancel { .. } => None,
            Action::Deliver {
                destination,
                properties,
                ..
            } => self
                .check_destination(destination)
                .err()
                .or_else(|| acceptable(properties)),
            Action::Wait { properties, .. } => acceptable(properties),
        };
        let Some(reason) = refusal else {
            return action;
        };
        let (properties, destination) = match action {
            Action::Deliver {
                properties,
                destination,
                ..
            } => (properties, Some(destination)),
            Action::Wait { properties, .. } => (
                envelope::sender_properties(&properties),
                envelope::read_transit(&properties)
                    .ok()
                    .map(|t| t.destination),
            ),
            own @ (Action::Park { .. } | Action::Cancel { .. }) => return own,
        };
        Action::Park {
            properties: parking::park(&properties, &reason, now_ms, destination.as_ref()),
            reason,
        }
    }

    /// Keeps `action` within one content-header frame of `frame_max` bytes.
    /// AMQP cannot split a header, and the broker closes the whole connection
    /// on a larger frame, so publishing such a message would fail on every
    /// redelivery. A message whose headers no longer fit once the router adds
    /// its own is parked from `sender` (the sender's properties, as they
    /// arrived) with a reason; if even that copy does not fit, the sender's
    /// largest headers are removed, each named in the reason.
    pub fn within_frame(
        &self,
        action: Action,
        sender: impl FnOnce() -> BasicProperties,
        now_ms: i64,
        frame_max: u32,
    ) -> Action {
        if wire::fits(action.properties(), frame_max) {
            return action;
        }
        let sender = &sender();
        let bytes = wire::header_frame_len(action.properties()).unwrap_or(usize::MAX);
        let too_large = ParkReason::HeadersTooLarge { bytes, frame_max };
        let (reason, destination) = match action {
            Action::Park {
                reason, properties, ..
            } => (reason, parking::parked_destination(&properties)),
            Action::Deliver { destination, .. } => (too_large, Some(destination)),
            // A tombstone's two headers always fit; the sender's message is not sent on.
            cancel @ Action::Cancel { .. } => return cancel,
            Action::Wait { properties, .. } => (
                too_large,
                envelope::read_transit(&properties)
                    .ok()
                    .map(|t| t.destination),
            ),
        };
        let fitted = parking::fit(sender, &reason, now_ms, destination.as_ref(), frame_max);
        let reason = fitted.reason(reason);
        Action::Park {
            properties: fitted.properties(&reason),
            reason,
        }
    }
}

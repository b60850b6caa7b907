//! Properties as they travel on the wire: their exact encoding (for the
//! content-header frame limit and for stable message ids). Pure.

use lapin::BasicProperties;
use lapin::protocol::basic::gen_properties;

/// RabbitMQ's default `frame_max`, used until a connection says otherwise.
pub const DEFAULT_FRAME_MAX: u32 = 131_072;

/// Bytes of a content-header frame around the encoded properties: frame type,
/// channel and size (7), class id, weight and body size (12), frame end (1).
const HEADER_FRAME_OVERHEAD: usize = 7 + 12 + 1;

/// The properties as AMQP 0-9-1 encodes them (flags, then each property).
/// `None` only if the encoder refuses them (a string too long for its type).
pub fn encode_properties(p: &BasicProperties) -> Option<Vec<u8>> {
    cookie_factory::gen_simple(gen_properties(p), Vec::new()).ok()
}

/// The size of the content-header frame that carries `p`.
pub fn header_frame_len(p: &BasicProperties) -> Option<usize> {
    encode_properties(p).map(|b| b.len() + HEADER_FRAME_OVERHEAD)
}

/// Whether `p` fits in one content-header frame under `frame_max` (AMQP does
/// not split a header; the broker closes the connection on a larger frame).
/// `frame_max = 0` means no limit, as in AMQP's tune.
pub fn fits(p: &BasicProperties, frame_max: u32) -> bool {
    match header_frame_len(p) {
        None => false,
        Some(_) if frame_max == 0 => true,
        Some(len) => len <= frame_max as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable, LongString};

    fn with_pad(n: usize) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(
            "pad".into(),
            AMQPValue::LongString(LongString::from("p".repeat(n))),
        );
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn encoding_counts_every_byte() {
        // Flags only.
        assert_eq!(
            encode_properties(&BasicProperties::default())
                .unwrap()
                .len(),
            2
        );
        // Flags, table length (4), key (1 + 3), type (1), string length (4) + 10.
        assert_eq!(
            encode_properties(&with_pad(10)).unwrap().len(),
            2 + 4 + 4 + 1 + 4 + 10
        );
    }

    #[test]
    fn the_frame_limit_is_the_brokers() {
        // The broker refused a 131,219-byte header payload against frame_max
        // 131,072 ("frame_too_large,131219,131064"): the payload may be at
        // most frame_max - 8, and the payload is 12 bytes plus the properties.
        let base = header_frame_len(&with_pad(0)).unwrap();
        let largest = DEFAULT_FRAME_MAX as usize - base;
        assert!(fits(&with_pad(largest), DEFAULT_FRAME_MAX));
        assert!(!fits(&with_pad(largest + 1), DEFAULT_FRAME_MAX));
        assert!(fits(&with_pad(largest + 1), 0));
    }
}

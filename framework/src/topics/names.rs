//! The names of a route's topics, derived from its main topic: pure string
//! rules in a module of their own, so that what only names topics (an
//! error message, the deployment model) does not depend on the admin
//! client.

/// The dead-letter topic of a main topic.
pub fn dlq_topic(main: &str) -> String {
    format!("{main}.dlq")
}

/// The compacted audit topic of a main topic's DLQ: one record per dead
/// letter that was re-driven or resolved, keyed by its coordinates.
pub fn dlq_audit_topic(main: &str) -> String {
    format!("{main}.dlq.audit")
}

/// The compacted topic where a strict-order route
/// ([`crate::WorkerBuilder::strict_order`]) keeps, per key, the jobs
/// waiting behind the one in its retry path: `<main>.order`, with the main
/// topic's partition count.
pub fn order_topic(main: &str) -> String {
    format!("{main}.order")
}

/// The main topic of a route topic: `orders` for `orders.dlq`,
/// `orders.dlq.audit`, `orders.retry.30s` and `orders.delay.1m`; a name
/// without such a suffix is its own. (`<main>.order` is left alone: a main
/// topic may well be called `shop.order`.)
pub fn route_of(topic: &str) -> &str {
    for suffix in [".dlq.audit", ".dlq"] {
        if let Some(main) = topic.strip_suffix(suffix) {
            if !main.is_empty() {
                return main;
            }
        }
    }
    for marker in [".retry.", ".delay."] {
        if let Some((main, bucket)) = topic.rsplit_once(marker) {
            let is_delay = crate::retry::parse_delay(bucket).is_some()
                || bucket
                    .strip_suffix('d')
                    .is_some_and(|d| d.parse::<u64>().is_ok());
            if !main.is_empty() && is_delay {
                return main;
            }
        }
    }
    topic
}

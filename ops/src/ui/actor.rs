//! Who an action is recorded as: the user an authenticating reverse proxy
//! names in a header (`X-Forwarded-User` behind oauth2-proxy), when the
//! dashboard is told to trust that header, and only from the proxy's own
//! addresses; `--by` otherwise.
//!
//! Anyone who can reach the dashboard directly can send any header, so the
//! header is believed only when the TCP peer is one of the configured
//! proxy addresses. A request from anywhere else is answered as before,
//! with the header ignored and `--by` as its actor.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use axum::http::HeaderMap;

/// The most characters of a user name kept in the audit.
const MAX_USER_CHARS: usize = 200;

/// An address or a CIDR block a trusted proxy connects from
/// (`127.0.0.1`, `10.0.0.0/8`, `::1`, `fd00::/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyAddr {
    net: IpAddr,
    prefix: u8,
}

impl ProxyAddr {
    /// Whether `ip` is in this block (an IPv4-mapped IPv6 peer counts as
    /// its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for ProxyAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("`{s}` is not an address or CIDR block ({why}), e.g. 127.0.0.1 or 10.0.0.0/8")
        };
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let net: IpAddr = addr.parse().map_err(|_| bad("no IP address"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad(&format!("the prefix must be 0 to {max}")))?,
        };
        Ok(Self { net, prefix })
    }
}

impl fmt::Display for ProxyAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Who the request acts as, for the audit. The guard puts it in every
/// request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Actor(pub(super) String);

/// The proxy header setting: which header names the user, and which peers
/// may set it.
#[derive(Clone, Debug, Default)]
pub(super) struct ProxyAuth {
    pub(super) header: Option<String>,
    pub(super) trusted: Vec<ProxyAddr>,
}

impl ProxyAuth {
    /// The actor of a request from `peer` (unknown when the server does not
    /// say, e.g. a worker's endpoint without connect info) carrying
    /// `headers`: the proxy's user when the header is configured, the peer
    /// is trusted and the value is a plausible name; `fallback` otherwise.
    pub(super) fn actor(
        &self,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
        fallback: &str,
    ) -> Actor {
        let from_proxy = (|| {
            let name = self.header.as_deref()?;
            let peer = peer?;
            if !self.trusted.iter().any(|t| t.contains(peer.ip())) {
                return None;
            }
            let value = std::str::from_utf8(headers.get(name)?.as_bytes())
                .ok()?
                .trim();
            let ok = !value.is_empty()
                && value.chars().count() <= MAX_USER_CHARS
                && !value
                    .chars()
                    .any(|c| c.is_control() || crate::terminal::is_bidi_control(c));
            ok.then(|| value.to_string())
        })();
        Actor(from_proxy.unwrap_or_else(|| fallback.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> ProxyAddr {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn blocks_parse_and_match() {
        assert!(addr("127.0.0.1").contains("127.0.0.1".parse().unwrap_or_else(|_| unreachable!())));
        assert!(!addr("127.0.0.1").contains("127.0.0.2".parse().unwrap_or_else(|_| unreachable!())));
        assert!(
            addr("10.0.0.0/8").contains("10.200.3.4".parse().unwrap_or_else(|_| unreachable!()))
        );
        assert!(!addr("10.0.0.0/8").contains("11.0.0.1".parse().unwrap_or_else(|_| unreachable!())));
        assert!(addr("0.0.0.0/0").contains("8.8.8.8".parse().unwrap_or_else(|_| unreachable!())));
        assert!(addr("::1").contains("::1".parse().unwrap_or_else(|_| unreachable!())));
        assert!(addr("fd00::/8").contains("fd12::1".parse().unwrap_or_else(|_| unreachable!())));
        assert!(addr("127.0.0.1").contains(
            "::ffff:127.0.0.1"
                .parse()
                .unwrap_or_else(|_| unreachable!())
        ));
        assert!(!addr("::1").contains("127.0.0.1".parse().unwrap_or_else(|_| unreachable!())));
        for bad in ["", "localhost", "10.0.0.0/33", "::1/129", "1.2.3.4/x"] {
            assert!(bad.parse::<ProxyAddr>().is_err(), "{bad}");
        }
        assert_eq!(addr("10.1.2.3/8").to_string(), "10.1.2.3/8");
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_peer() {
        let auth = ProxyAuth {
            header: Some("x-forwarded-user".into()),
            trusted: vec![addr("10.0.0.0/8")],
        };
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-user",
            "ann@example.com".parse().unwrap_or_else(|_| unreachable!()),
        );
        let proxy: SocketAddr = "10.0.0.7:5000".parse().unwrap_or_else(|_| unreachable!());
        let other: SocketAddr = "192.168.1.9:5000"
            .parse()
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(auth.actor(&h, Some(proxy), "ops").0, "ann@example.com");
        assert_eq!(
            auth.actor(&h, Some(other), "ops").0,
            "ops",
            "untrusted peer"
        );
        assert_eq!(auth.actor(&h, None, "ops").0, "ops", "unknown peer");
        assert_eq!(
            auth.actor(&HeaderMap::new(), Some(proxy), "ops").0,
            "ops",
            "no header"
        );
        h.insert(
            "x-forwarded-user",
            axum::http::HeaderValue::from_bytes("a\u{202e}b".as_bytes())
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            auth.actor(&h, Some(proxy), "ops").0,
            "ops",
            "a bidi control"
        );
        h.insert(
            "x-forwarded-user",
            axum::http::HeaderValue::from_bytes("José".as_bytes())
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(auth.actor(&h, Some(proxy), "ops").0, "José", "UTF-8 names");
        let off = ProxyAuth::default();
        assert_eq!(off.actor(&h, Some(proxy), "ops").0, "ops", "off by default");
    }
}

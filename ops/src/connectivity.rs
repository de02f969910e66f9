//! Whether Kafka answers, and if not, why, in one line: what an operator
//! who mistyped `--bootstrap-server` needs, within the timeout they set,
//! instead of librdkafka's "BrokerTransportFailure" after ten seconds.
//!
//! [`check_kafka`] asks for metadata with a client that listens to
//! librdkafka's error events, which carry the reason per broker
//! ("Connect to ipv4#127.0.0.1:1 failed: Connection refused", "Failed to
//! resolve 'nosuch:9092'", "Connection setup timed out"). It gives up as
//! soon as librdkafka reports every bootstrap broker down (a refused
//! connection or a name that does not resolve says so at once), or when the
//! timeout runs out (a host that swallows packets).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::problem::Problem;
use kjob::config::KafkaConfig;

/// Why Kafka could not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The address answered with a refusal: nothing listens there.
    Refused,
    /// The host name does not resolve.
    Dns,
    /// No answer within the timeout.
    Timeout,
    /// The TLS handshake failed.
    Tls,
    /// The cluster refused the credentials.
    Authentication,
    /// Something else librdkafka reported.
    Other,
}

impl Cause {
    /// Classifies one of librdkafka's error reasons.
    pub fn of(reason: &str) -> Cause {
        let r = reason.to_ascii_lowercase();
        if r.contains("connection refused") {
            Cause::Refused
        } else if r.contains("failed to resolve")
            || r.contains("name or service not known")
            || r.contains("nodename nor servname")
            || r.contains("no address associated")
            || r.contains("temporary failure in name resolution")
        {
            Cause::Dns
        } else if r.contains("timed out") || r.contains("timeout") {
            Cause::Timeout
        } else if r.contains("ssl") || r.contains("tls") || r.contains("certificate") {
            Cause::Tls
        } else if r.contains("sasl") || r.contains("authentication") {
            Cause::Authentication
        } else {
            Cause::Other
        }
    }

    fn says(self) -> &'static str {
        match self {
            Cause::Refused => "connection refused (nothing listens there)",
            Cause::Dns => "the host name does not resolve (DNS)",
            Cause::Timeout => "no answer (timed out)",
            Cause::Tls => "the TLS handshake failed",
            Cause::Authentication => "the credentials were refused",
            Cause::Other => "unreachable",
        }
    }
}

#[derive(Default)]
struct Heard {
    /// `(all brokers down, reason)` of every error event, and of every
    /// warning or error log line (where librdkafka says why a connection
    /// failed or timed out), in order.
    events: Vec<(bool, String)>,
}

/// A client context that keeps librdkafka's error events.
#[derive(Default)]
struct Listener(Mutex<Heard>);

impl ClientContext for Listener {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning | L::Notice
        ) {
            tracing::debug!(fac, log_message, "librdkafka while checking connectivity");
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .events
                .push((false, log_message.to_string()));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let down = error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown);
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .events
            .push((down, reason.to_string()));
    }
}

impl ConsumerContext for Listener {}

/// The probe asks for one topic by name rather than the whole cluster's
/// metadata: cheap on a cluster of any size, and an unknown (or
/// unauthorized) topic still proves the brokers answer.
const PROBE_TOPIC: &str = "__kjob_connectivity_probe";

/// Checks that a broker of `config` answers a metadata request within
/// `timeout`. Blocking. The error is one line naming the bootstrap
/// servers and the [`Cause`]; its kind is
/// [`Unreachable`](crate::problem::Kind::Unreachable), or
/// [`Refused`](crate::problem::Kind::Refused) for TLS and credentials.
pub fn check_kafka(config: &KafkaConfig, timeout: Duration) -> Result<(), Problem> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128).to_string();
    let client: BaseConsumer<Listener> = config
        .client_config(&[
            ("socket.connection.setup.timeout.ms", ms.as_str()),
            ("allow.auto.create.topics", "false"),
            // rust-rdkafka sets librdkafka's log level from the `log`
            // crate's, which is off in the CLI: the reasons are in the log.
            ("log_level", "6"),
        ])
        .create_with_context(Listener::default())
        .map_err(|e| Problem::usage(format!("the Kafka settings are unusable: {e}")))?;
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.min(Duration::from_millis(250));
        if client.fetch_metadata(Some(PROBE_TOPIC), attempt).is_ok() {
            return Ok(());
        }
        // Serve the queued error events so the context hears them.
        let _ = client.poll(Duration::from_millis(5));
        let heard = client
            .context()
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .events
            .clone();
        let all_down = heard.iter().any(|(down, _)| *down);
        if all_down || Instant::now() >= deadline {
            let timed_out = started.elapsed() + Duration::from_millis(300) >= timeout;
            return Err(unreachable(config, timeout, &heard, timed_out));
        }
    }
}

fn unreachable(
    config: &KafkaConfig,
    timeout: Duration,
    heard: &[(bool, String)],
    timed_out: bool,
) -> Problem {
    // The most telling reason: a per-broker one, not "1/1 brokers are down".
    let reason = heard
        .iter()
        .filter(|(down, _)| !down)
        .map(|(_, r)| r.as_str())
        .find(|r| Cause::of(r) != Cause::Other)
        .or_else(|| heard.iter().map(|(_, r)| r.as_str()).next_back());
    let cause = match reason.map(Cause::of) {
        Some(c) if c != Cause::Other => c,
        _ if timed_out => Cause::Timeout,
        _ => Cause::Other,
    };
    let within = humantime::format_duration(Duration::from_millis(timeout.as_millis() as u64));
    let what = match cause {
        Cause::Timeout => format!("no answer within {within} (timed out)"),
        other => other.says().to_string(),
    };
    // Log lines start with the thread: `[thrd:host:port/bootstrap]: `.
    let detail = reason
        .map(|r| {
            let r = r.trim();
            let r = match r.strip_prefix("[thrd:") {
                Some(rest) => rest.split_once("]: ").map_or(r, |(_, msg)| msg),
                None => r,
            };
            format!(" [librdkafka: {r}]")
        })
        .unwrap_or_default();
    let message = format!(
        "cannot reach Kafka at {}: {what}; check --bootstrap-server (KJOB_BOOTSTRAP_SERVERS){}{detail}",
        config.bootstrap_servers,
        if cause == Cause::Timeout {
            ", or raise --timeout"
        } else {
            ""
        }
    );
    match cause {
        Cause::Tls | Cause::Authentication => Problem::refused(message),
        _ => Problem::unreachable(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_reasons_classify() {
        for (reason, cause) in [
            ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)", Cause::Refused),
            ("nosuch.invalid:9092/bootstrap: Failed to resolve 'nosuch.invalid:9092': Name or service not known (after 3ms in state CONNECT)", Cause::Dns),
            ("10.0.0.1:9092/bootstrap: Connection setup timed out in state CONNECT (after 2001ms in state CONNECT)", Cause::Timeout),
            ("b:9093/bootstrap: SSL handshake failed: certificate verify failed", Cause::Tls),
            ("b:9092/bootstrap: SASL authentication error: Authentication failed", Cause::Authentication),
        ] {
            assert_eq!(Cause::of(reason), cause, "{reason}");
        }
    }
}

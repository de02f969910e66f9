//! Unit tests of `classify`.

use super::*;

#[test]
fn classes_route_as_documented() {
    assert!(JobError::server("503").class().is_retryable());
    assert!(JobError::retry_after(Duration::from_secs(3), "429")
        .class()
        .is_retryable());
    assert!(!JobError::not_found("order 7").class().is_retryable());
    assert!(!ErrorClass::Panic.is_retryable());
    assert!(!ErrorClass::DecodeUnknownSchema.is_retryable());
    assert_eq!(JobError::timeout("x").class().as_str(), "retryable.timeout");
    assert_eq!(
        JobError::invalid_input("x").to_string(),
        "permanent.invalid_input: x"
    );
}

use std::error::Error as _;
use std::io;

fn class_of(e: impl Into<JobError>) -> ErrorClass {
    e.into().class()
}

#[test]
fn io_errors_retry_and_say_why() {
    assert_eq!(
        class_of(io::Error::from(io::ErrorKind::ConnectionRefused)),
        ErrorClass::RetryableNetwork
    );
    assert_eq!(
        class_of(io::Error::from(io::ErrorKind::ConnectionReset)),
        ErrorClass::RetryableNetwork
    );
    assert_eq!(
        class_of(io::Error::from(io::ErrorKind::TimedOut)),
        ErrorClass::RetryableTimeout
    );
    assert_eq!(
        class_of(io::Error::from(io::ErrorKind::PermissionDenied)),
        ErrorClass::Retryable
    );
    let e = JobError::from(io::Error::new(
        io::ErrorKind::ConnectionReset,
        "peer hung up",
    ));
    assert_eq!(e.message(), "peer hung up");
    let source = e.source().and_then(|s| s.downcast_ref::<io::Error>());
    assert_eq!(
        source.map(io::Error::kind),
        Some(io::ErrorKind::ConnectionReset)
    );
}

#[derive(Debug)]
struct Outer(io::Error);
impl fmt::Display for Outer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("loading order 7")
    }
}
impl std::error::Error for Outer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn the_message_carries_the_whole_chain() {
    let e: Result<(), _> = Err(Outer(io::Error::other("disk on fire")));
    let e = e.permanent().err();
    assert_eq!(
        e.as_ref().map(JobError::message),
        Some("loading order 7: disk on fire")
    );
    assert!(e
        .as_ref()
        .and_then(|e| e.source())
        .is_some_and(|s| s.is::<Outer>()));
}

#[tokio::test]
async fn an_elapsed_timeout_is_a_timeout() {
    let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>()).await;
    let e = elapsed.map_err(JobError::from).err();
    assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableTimeout));
}

#[test]
fn bad_json_is_invalid_input() {
    let parsed = serde_json::from_str::<u32>("{\"not\": 7}").map_err(JobError::from);
    let e = parsed.err();
    assert_eq!(
        e.as_ref().map(|e| e.class()),
        Some(ErrorClass::PermanentInvalidInput)
    );
    assert!(e.is_some_and(|e| e.message().contains("expected u32")));
}

#[test]
fn result_ext_reclassifies_and_keeps_the_source() {
    let io_err = || Err::<(), _>(io::Error::from(io::ErrorKind::ConnectionRefused));
    let cases: [(Result<(), JobError>, ErrorClass); 7] = [
        (io_err().permanent(), ErrorClass::Permanent),
        (io_err().invalid_input(), ErrorClass::PermanentInvalidInput),
        (io_err().not_found(), ErrorClass::PermanentNotFound),
        (io_err().retryable(), ErrorClass::Retryable),
        (io_err().timeout(), ErrorClass::RetryableTimeout),
        (io_err().server(), ErrorClass::RetryableServer),
        (
            io_err().retry_after(Duration::from_secs(9)),
            ErrorClass::RetryAfter,
        ),
    ];
    for (got, class) in cases {
        let e = got.err();
        assert_eq!(e.as_ref().map(JobError::class), Some(class));
        assert!(e.and_then(|e| e.source().map(|s| s.is::<io::Error>())) == Some(true));
    }
    let after = io_err().retry_after(Duration::from_secs(9)).err();
    assert_eq!(
        after.and_then(|e| e.retry_after_hint()),
        Some(Duration::from_secs(9))
    );
}

#[test]
fn reclassifying_a_job_error_does_not_nest_it() {
    let first = JobError::from(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
    let again = Err::<(), _>(first).not_found().err();
    assert_eq!(again.as_ref().map(JobError::message), Some("reset"));
    assert_eq!(
        again.as_ref().map(JobError::class),
        Some(ErrorClass::PermanentNotFound)
    );
    assert!(again.and_then(|e| e.source().map(|s| s.is::<io::Error>())) == Some(true));
}

#[test]
fn anyhow_errors_take_the_class_of_what_they_wrap() {
    use anyhow::Context as _;
    let io: anyhow::Result<()> =
        Err(io::Error::from(io::ErrorKind::ConnectionRefused)).context("loading order 7");
    let e = io.map_err(JobError::from).err();
    assert_eq!(
        e.as_ref().map(JobError::class),
        Some(ErrorClass::RetryableNetwork)
    );
    let message = e
        .as_ref()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(message.starts_with("loading order 7: "), "{message}");
    assert!(e.and_then(|e| e.source().map(|_| ())).is_some());

    let json = serde_json::from_str::<u32>("x").map_err(anyhow::Error::from);
    let e = json.map_err(JobError::from).err();
    assert_eq!(
        e.map(|e| e.class()),
        Some(ErrorClass::PermanentInvalidInput)
    );

    let inner: anyhow::Result<()> =
        Err(JobError::retry_after(Duration::from_secs(4), "429")).context("calling the CRM");
    let e = inner.map_err(JobError::from).err();
    assert_eq!(
        e.as_ref().and_then(JobError::retry_after_hint),
        Some(Duration::from_secs(4))
    );

    let plain = JobError::from(anyhow::anyhow!("something odd"));
    assert_eq!(plain.class(), ErrorClass::Retryable);
    assert_eq!(plain.message(), "something odd");
}

#[test]
fn option_ext_names_what_is_missing() {
    let e = None::<u32>.or_not_found("order 7").err();
    assert_eq!(e, Some(JobError::not_found("order 7")));
    let e = None::<u32>.or_invalid_input("no email").err();
    assert_eq!(
        e.map(|e| e.class()),
        Some(ErrorClass::PermanentInvalidInput)
    );
}

#[test]
fn equality_ignores_the_source_and_clone_keeps_it() {
    let with = JobError::server("503").with_source(io::Error::other("x"));
    assert_eq!(with, JobError::server("503"));
    assert_ne!(with, JobError::timeout("503"));
    assert_ne!(
        JobError::retry_after(Duration::from_secs(1), "429"),
        JobError::retry_after(Duration::from_secs(2), "429")
    );
    assert!(with.clone().source().is_some());
}

#[test]
fn kjob_errors_map_by_permanence() {
    let rejected = crate::Error::Rejected {
        topic: "t".into(),
        reason: "record too large",
        message: "m".into(),
        hint: "h",
    };
    assert_eq!(class_of(rejected), ErrorClass::Permanent);
    let delivery = crate::Error::Delivery {
        topic: "t".into(),
        timeout: Duration::from_secs(1),
        bootstrap: "b".into(),
        message: "m".into(),
    };
    assert_eq!(class_of(delivery), ErrorClass::RetryableNetwork);
    assert_eq!(class_of(crate::Error::NoHandlers), ErrorClass::Retryable);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_data_and_constraint_errors_are_permanent() {
    use super::from::postgres::for_sqlstate;
    let class = |code: Option<&str>| for_sqlstate(code)(String::new()).class();
    assert_eq!(
        class(Some("23505")),
        ErrorClass::Permanent,
        "unique_violation"
    );
    assert_eq!(
        class(Some("23503")),
        ErrorClass::Permanent,
        "foreign_key_violation"
    );
    assert_eq!(
        class(Some("22P02")),
        ErrorClass::PermanentInvalidInput,
        "bad text repr"
    );
    assert_eq!(
        class(Some("22001")),
        ErrorClass::PermanentInvalidInput,
        "too long"
    );
    assert_eq!(
        class(Some("40001")),
        ErrorClass::Retryable,
        "serialization_failure"
    );
    assert_eq!(class(Some("40P01")), ErrorClass::Retryable, "deadlock");
    assert_eq!(
        class(Some("57P01")),
        ErrorClass::RetryableNetwork,
        "admin_shutdown"
    );
    assert_eq!(
        class(Some("57014")),
        ErrorClass::RetryableTimeout,
        "query_canceled"
    );
    assert_eq!(class(Some("08006")), ErrorClass::RetryableNetwork);
    assert_eq!(
        class(None),
        ErrorClass::RetryableNetwork,
        "no server answer"
    );
    let timeout = JobError::from(tokio_postgres::Error::__private_api_timeout());
    assert_eq!(timeout.class(), ErrorClass::RetryableNetwork);
    assert!(timeout
        .source()
        .is_some_and(|s| s.is::<tokio_postgres::Error>()));
}

fn response(status: u16, retry_after: Option<&str>) -> reqwest::Response {
    let mut b = ::http::Response::builder().status(status);
    if let Some(v) = retry_after {
        b = b.header("retry-after", v);
    }
    let built = b.body(String::new());
    assert!(built.is_ok(), "test response for {status}");
    reqwest::Response::from(built.unwrap_or_default())
}

#[test]
fn http_statuses_map_as_documented() {
    let expect = [
        (429, ErrorClass::RetryAfter),
        (408, ErrorClass::RetryableTimeout),
        (500, ErrorClass::RetryableServer),
        (503, ErrorClass::RetryableServer),
        (404, ErrorClass::PermanentNotFound),
        (410, ErrorClass::PermanentNotFound),
        (400, ErrorClass::PermanentInvalidInput),
        (422, ErrorClass::PermanentInvalidInput),
        (401, ErrorClass::Permanent),
        (409, ErrorClass::Permanent),
    ];
    for (status, class) in expect {
        // Through `?` on `error_for_status()`...
        let via_from = response(status, None)
            .error_for_status()
            .map_err(JobError::from);
        assert_eq!(via_from.err().map(|e| e.class()), Some(class), "{status}");
        // ...and through `classify_status()`.
        let via_ext = response(status, None).classify_status();
        assert_eq!(via_ext.err().map(|e| e.class()), Some(class), "{status}");
    }
    assert!(response(200, None).classify_status().is_ok());
    assert!(response(304, None).classify_status().is_ok());
}

#[test]
fn a_429_honours_retry_after_when_it_can_see_it() {
    let hint = |r: reqwest::Response| r.classify_status().err().and_then(|e| e.retry_after_hint());
    assert_eq!(hint(response(429, Some("7"))), Some(Duration::from_secs(7)));
    assert_eq!(hint(response(429, None)), Some(DEFAULT_RETRY_AFTER));
    assert_eq!(hint(response(429, Some("soon"))), Some(DEFAULT_RETRY_AFTER));
    let in_90s = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(90));
    let waited = hint(response(429, Some(&in_90s))).unwrap_or_default();
    assert!(
        waited > Duration::from_secs(85) && waited <= Duration::from_secs(90),
        "{waited:?}"
    );
    // `error_for_status` drops the headers: the default applies.
    let from = response(429, Some("7"))
        .error_for_status()
        .map_err(JobError::from);
    assert_eq!(
        from.err().and_then(|e| e.retry_after_hint()),
        Some(DEFAULT_RETRY_AFTER)
    );
}

#[test]
fn retry_after_values_parse() {
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
    assert_eq!(
        parse_retry_after(" 120 ", now),
        Some(Duration::from_secs(120))
    );
    // RFC 9110's example date is 784111777 s after the epoch.
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
        Some(Duration::from_secs(60))
    );
    assert_eq!(parse_retry_after("-3", now), None);
}

#[tokio::test]
async fn reqwest_transport_failures_are_network_or_timeout() {
    // Nothing listens on a port we bound and closed again.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port());
    let Ok(port) = closed else {
        panic!("cannot bind a loopback port: {closed:?}");
    };
    let refused = reqwest::get(format!("http://127.0.0.1:{port}/")).await;
    let e = refused.map_err(JobError::from).err();
    assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableNetwork));

    // A server that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await;
    let Ok(silent) = silent else {
        panic!("cannot bind a loopback port: {silent:?}");
    };
    let addr = silent.local_addr().map_err(|e| e.to_string());
    let accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build();
    let (Ok(client), Ok(addr)) = (client, addr) else {
        panic!("client or address");
    };
    let hung = client.get(format!("http://{addr}/")).send().await;
    accept.abort();
    let e = hung.map_err(JobError::from).err();
    assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableTimeout));

    let bad_url = reqwest::Client::new().get("http://[::1").send().await;
    let e = bad_url.map_err(JobError::from).err();
    assert_eq!(
        e.map(|e| e.class()),
        Some(ErrorClass::PermanentInvalidInput)
    );
}

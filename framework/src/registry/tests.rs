//! Unit tests of `registry`.

use super::settings::{ENV_CONNECT_TIMEOUT, ENV_PASSWORD, ENV_TIMEOUT, ENV_TOKEN, ENV_USER};
use super::*;
use crate::config::{KafkaConfig, Secret};
use std::collections::HashMap;
use std::time::Duration;

fn resolve(options: &RegistryOptions, vars: &[(&str, &str)]) -> Result<RegistrySettings> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    RegistrySettings::resolve_with("http://r:8081/apis/ccompat/v7/", options, |k| {
        vars.get(k).cloned()
    })
}

#[test]
fn defaults_env_and_config_in_that_order() -> Result<()> {
    let s = resolve(&RegistryOptions::default(), &[])?;
    assert_eq!(s.url, "http://r:8081/apis/ccompat/v7");
    assert_eq!(s.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    assert_eq!(s.request_timeout, DEFAULT_REQUEST_TIMEOUT);
    assert_eq!(s.auth, None);

    let s = resolve(
        &RegistryOptions::default(),
        &[(ENV_TIMEOUT, "250"), (ENV_TOKEN, "t0k")],
    )?;
    assert_eq!(s.request_timeout, Duration::from_millis(250));
    assert_eq!(s.auth, Some(RegistryAuth::Bearer(Secret::new("t0k"))));

    let explicit = RegistryOptions {
        request_timeout: Some(Duration::from_secs(2)),
        auth: Some(RegistryAuth::Basic {
            user: "key".into(),
            password: Secret::new("secret"),
        }),
        ..Default::default()
    };
    let s = resolve(&explicit, &[(ENV_TIMEOUT, "250"), (ENV_TOKEN, "t0k")])?;
    assert_eq!(s.request_timeout, Duration::from_secs(2), "config wins");
    assert!(matches!(s.auth, Some(RegistryAuth::Basic { .. })));
    Ok(())
}

#[test]
fn unusable_environment_names_the_variable() {
    for (vars, name) in [
        (vec![(ENV_TIMEOUT, "10s")], ENV_TIMEOUT),
        (vec![(ENV_CONNECT_TIMEOUT, "0")], ENV_CONNECT_TIMEOUT),
        (vec![(ENV_USER, "key")], ENV_PASSWORD),
        (vec![(ENV_PASSWORD, "pw")], ENV_USER),
        (
            vec![(ENV_USER, "k"), (ENV_PASSWORD, "p"), (ENV_TOKEN, "t")],
            ENV_TOKEN,
        ),
    ] {
        match resolve(&RegistryOptions::default(), &vars) {
            Err(Error::InvalidSetting { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{vars:?}: {other:?}"),
        }
    }
}

#[test]
fn credentials_never_print() -> Result<()> {
    let s = resolve(
        &RegistryOptions::default(),
        &[(ENV_USER, "api-key"), (ENV_PASSWORD, "hunter2")],
    )?;
    let client = RegistryClient::new(s.clone())?;
    for printed in [format!("{s:?}"), format!("{client:?}")] {
        assert!(!printed.contains("hunter2"), "{printed}");
    }
    let config = KafkaConfig::new("b:9092", "http://r").registry_bearer_token("tok-123");
    assert!(!format!("{config:?}").contains("tok-123"));
    let err = resolve(
        &RegistryOptions::default(),
        &[
            (ENV_USER, "k"),
            (ENV_PASSWORD, "hunter2"),
            (ENV_TOKEN, "tok-123"),
        ],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        !err.contains("hunter2") && !err.contains("tok-123") && !err.is_empty(),
        "{err}"
    );
    Ok(())
}

#[test]
fn credentials_in_the_url_never_print() -> Result<()> {
    assert_eq!(
        redact_url("https://key:secret@sr.example:443/apis/ccompat/v7"),
        "https://***@sr.example:443/apis/ccompat/v7"
    );
    assert_eq!(redact_url("http://r:8081/a@b"), "http://r:8081/a@b");
    assert_eq!(redact_url("http://r:8081"), "http://r:8081");
    let s = resolve_at("http://key:secret@127.0.0.1:1")?;
    let client = RegistryClient::new(s.clone())?;
    for printed in [
        format!("{s:?}"),
        format!("{client:?}"),
        client.url().to_string(),
    ] {
        assert!(!printed.contains("secret"), "{printed}");
    }
    let config = KafkaConfig::new("b:9092", "http://key:secret@r")
        .set("sasl.password", "hunter2")
        .set("client.id", "visible");
    let printed = format!("{config:?}");
    assert!(
        !printed.contains("secret") && !printed.contains("hunter2"),
        "{printed}"
    );
    assert!(printed.contains("visible"), "{printed}");
    Ok(())
}

#[test]
fn registry_messages_are_extracted() {
    assert_eq!(
        registry_message(r#"{"error_code":409,"message":"incompatible: field x"}"#),
        "incompatible: field x"
    );
    assert_eq!(registry_message("  Bad Gateway "), "Bad Gateway");
}

fn client(url: &str) -> Result<RegistryClient> {
    RegistryClient::new(resolve_at(url)?)
}

fn resolve_at(url: &str) -> Result<RegistrySettings> {
    RegistrySettings::resolve_with(url, &RegistryOptions::default(), |_| None)
}

#[tokio::test]
async fn a_404_is_told_apart_by_status_not_text() -> Result<()> {
    // The body says nothing about "404": only the status does.
    let (url, server) = test_server::answering(404, r#"{"message":"nope"}"#)
        .await
        .map_err(|e| Error::Registry {
            url: "test".into(),
            message: e.to_string(),
        })?;
    let c = client(&url)?;
    assert_eq!(c.schema_by_id(7).await?, None);
    assert_eq!(c.versions("s-value").await?, Vec::<u32>::new());
    assert_eq!(c.compatibility("s-value").await?, None);
    server.abort();
    Ok(())
}

#[tokio::test]
async fn other_statuses_are_errors_that_name_the_registry() -> Result<()> {
    let (url, server) = test_server::answering(500, r#"{"message":"store down"}"#)
        .await
        .map_err(|e| Error::Registry {
            url: "test".into(),
            message: e.to_string(),
        })?;
    let c = client(&url)?;
    match c.schema_by_id(7).await {
        Err(Error::Registry {
            url: named,
            message,
        }) => {
            assert_eq!(named, url);
            assert!(
                message.contains("500") && message.contains("store down"),
                "{message}"
            );
        }
        other => panic!("expected a registry error, got {other:?}"),
    }
    server.abort();
    let (url, server) = test_server::answering(401, "{}")
        .await
        .map_err(|e| Error::Registry {
            url: "test".into(),
            message: e.to_string(),
        })?;
    let c = client(&url)?;
    assert!(matches!(
        c.versions("s-value").await,
        Err(Error::RegistryUnauthorized { status: 401, .. })
    ));
    server.abort();
    Ok(())
}

#[tokio::test]
async fn a_failed_call_is_made_once_more_and_its_second_answer_stands() -> Result<()> {
    let schema = r#"{"schema":"\"string\""}"#;
    // A 503, then the answer: the retry gets it.
    let (url, server) = test_server::answering_in_turn(vec![(503, "{}"), (200, schema)])
        .await
        .map_err(io)?;
    assert_eq!(
        client(&url)?.schema_by_id(7).await?.as_deref(),
        Some("\"string\"")
    );
    server.abort();
    // Two 500s: one retry only, so the second fails the call.
    let (url, server) =
        test_server::answering_in_turn(vec![(500, "{}"), (500, "{}"), (200, schema)])
            .await
            .map_err(io)?;
    assert!(matches!(
        client(&url)?.schema_by_id(7).await,
        Err(Error::Registry { .. })
    ));
    server.abort();
    // A 404 is an answer, not a failure: not tried again.
    let (url, server) = test_server::answering_in_turn(vec![(404, "{}"), (200, schema)])
        .await
        .map_err(io)?;
    assert_eq!(client(&url)?.schema_by_id(7).await?, None);
    server.abort();
    Ok(())
}

fn io(e: std::io::Error) -> Error {
    Error::Registry {
        url: "test".into(),
        message: e.to_string(),
    }
}

const ALREADY_EXISTS: &str =
    r#"{"message":"A rule named 'COMPATIBILITY' already exists.","error_code":0}"#;

#[tokio::test]
async fn a_level_another_client_just_set_to_the_same_value_is_success() -> Result<()> {
    let (url, server) = test_server::answering_in_turn(vec![
        (409, ALREADY_EXISTS),
        (200, r#"{"compatibilityLevel":"BACKWARD"}"#),
    ])
    .await
    .map_err(io)?;
    client(&url)?
        .set_compatibility("t-value", Compatibility::Backward)
        .await?;
    server.abort();
    Ok(())
}

#[tokio::test]
async fn a_level_another_client_just_set_differently_names_both_and_the_fix() -> Result<()> {
    let (url, server) = test_server::answering_in_turn(vec![
        (409, ALREADY_EXISTS),
        (200, r#"{"compatibilityLevel":"FULL"}"#),
    ])
    .await
    .map_err(io)?;
    let err = client(&url)?
        .set_compatibility("t-value", Compatibility::Backward)
        .await
        .err();
    server.abort();
    match &err {
        Some(Error::CompatibilityConflict {
            subject,
            wanted: Compatibility::Backward,
            found: Compatibility::Full,
            ..
        }) if subject == "t-value" => {}
        other => panic!("expected a compatibility conflict, got {other:?}"),
    }
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    for needle in [
        "`t-value`",
        "BACKWARD",
        "FULL",
        "/config/t-value",
        "start again",
    ] {
        assert!(text.contains(needle), "lacks {needle}: {text}");
    }
    Ok(())
}

#[tokio::test]
async fn a_conflict_with_no_level_behind_it_stays_an_error() -> Result<()> {
    let (url, server) = test_server::answering_in_turn(vec![
        (409, ALREADY_EXISTS),
        (404, r#"{"message":"no config"}"#),
    ])
    .await
    .map_err(io)?;
    let got = client(&url)?
        .set_compatibility("t-value", Compatibility::Backward)
        .await;
    server.abort();
    match got {
        Err(Error::Registry { message, .. }) => {
            assert!(
                message.contains("409") && message.contains("already exists"),
                "{message}"
            )
        }
        other => panic!("expected the registry's 409, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn registration_refusals_are_answers_not_errors() -> Result<()> {
    let (url, server) =
        test_server::answering(409, r#"{"error_code":409,"message":"incompatible"}"#)
            .await
            .map_err(|e| Error::Registry {
                url: "test".into(),
                message: e.to_string(),
            })?;
    let got = client(&url)?.register("s-value", "\"string\"").await?;
    assert_eq!(
        got,
        Registration::Refused {
            status: 409,
            message: "incompatible".into()
        }
    );
    server.abort();
    let (url, server) = test_server::answering(200, r#"{"id":42}"#)
        .await
        .map_err(|e| Error::Registry {
            url: "test".into(),
            message: e.to_string(),
        })?;
    assert_eq!(
        client(&url)?.register("s-value", "\"string\"").await?,
        Registration::Id(42)
    );
    server.abort();
    Ok(())
}

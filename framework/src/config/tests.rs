//! Unit tests of `config`.

use super::*;

#[test]
fn debug_never_shows_a_secret() {
    let c = KafkaConfig::new("b:9092", "http://r")
        .security_protocol("SASL_SSL")
        .sasl("SCRAM-SHA-512", "worker", Secret::new("hunter2-pw"))
        .set("ssl.key.password", "keypw-123")
        .set("sasl.oauthbearer.client.secret", "oauth-456")
        .set("linger.ms", "5");
    let shown = format!("{c:?} {c:#?}");
    for secret in ["hunter2-pw", "keypw-123", "oauth-456"] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }
    assert!(shown.contains("worker") && shown.contains("SASL_SSL"));
    assert!(shown.contains("\"linger.ms\": \"5\""), "{shown}");
    assert_eq!(format!("{}", Secret::new("x")), "***");
}

#[test]
fn security_reaches_librdkafka_and_overrides_win() {
    let c = KafkaConfig::new("b:9092", "http://r")
        .security_protocol("SASL_SSL")
        .sasl("SCRAM-SHA-512", "worker", Secret::new("pw"))
        .ssl_ca_location("/tmp/ca.crt")
        .set("sasl.mechanism", "SCRAM-SHA-256");
    let cfg = c.client_config(&[]);
    assert_eq!(cfg.get("security.protocol"), Some("SASL_SSL"));
    assert_eq!(cfg.get("sasl.username"), Some("worker"));
    assert_eq!(cfg.get("sasl.password"), Some("pw"));
    assert_eq!(cfg.get("ssl.ca.location"), Some("/tmp/ca.crt"));
    assert_eq!(cfg.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
    let plain = KafkaConfig::new("b:9092", "http://r").client_config(&[]);
    assert_eq!(plain.get("security.protocol"), None);
}

#[test]
fn sasl_ssl_without_openssl_names_the_tls_feature() {
    let config = KafkaConfig::new("127.0.0.1:1", "http://r")
        .security_protocol("SASL_SSL")
        .sasl("SCRAM-SHA-512", "u", Secret::new("p"));
    let created: std::result::Result<rdkafka::consumer::BaseConsumer, _> =
        config.client_config(&[]).create();
    let tls = cfg!(feature = "tls");
    match created {
        Ok(_) => assert!(tls, "SASL_SSL accepted without OpenSSL"),
        Err(e) => {
            assert!(!tls, "{e}");
            let err = crate::Error::kafka("creating consumer", e).to_string();
            assert!(err.contains("`tls` feature"), "{err}");
        }
    }
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kjob-config-{}-{name}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("client.properties");
    let _ = std::fs::write(&path, text);
    path
}

fn load(vars: &[(&str, &str)], file: Option<&Path>) -> KafkaConfig {
    let owned: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let kafka: Vec<(String, String)> = owned
        .iter()
        .filter(|(k, _)| k.starts_with(PROPERTY_ENV_PREFIX))
        .cloned()
        .collect();
    let lookup = move |name: &str| {
        owned
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    KafkaConfig::from_sources(&lookup, &kafka, file)
}

#[test]
fn variables_name_properties() {
    assert_eq!(
        property_for_variable("KJOB_KAFKA_CLIENT_RACK").as_deref(),
        Some("client.rack")
    );
    assert_eq!(
        property_for_variable("KJOB_KAFKA_SASL_OAUTHBEARER_CLIENT_ID").as_deref(),
        Some("sasl.oauthbearer.client.id")
    );
    for not in [
        "KJOB_KAFKA_CONFIG_FILE",
        "KJOB_KAFKA_JAVA",
        "KJOB_KAFKA_",
        "KJOB_GROUP",
    ] {
        assert_eq!(property_for_variable(not), None, "{not}");
    }
}

#[test]
fn precedence_file_then_kafka_variables_then_named_variables_then_code() {
    let file = temp_file(
        "precedence",
        "bootstrap.servers=file:9092\nclient.rack=from-file\nlinger.ms=7\n\
         security.protocol=SASL_PLAINTEXT\nsasl.username=file-user\n\
         schema.registry.url=http://file-registry/\n",
    );
    // The file alone: its bootstrap, its properties.
    let c = load(&[], Some(&file));
    assert_eq!(c.bootstrap_servers, "file:9092");
    assert_eq!(c.schema_registry_url, "http://file-registry");
    assert_eq!(
        c.overrides.get("client.rack").map(String::as_str),
        Some("from-file")
    );
    assert_eq!(c.security_protocol.as_deref(), Some("SASL_PLAINTEXT"));
    // KJOB_KAFKA_ variables win over the file, named variables over both.
    let c = load(
        &[
            ("KJOB_KAFKA_CLIENT_RACK", "from-var"),
            ("KJOB_KAFKA_SASL_USERNAME", "var-user"),
            ("KJOB_KAFKA_BOOTSTRAP_SERVERS", "var:9092"),
            ("KJOB_SASL_USERNAME", "named-user"),
        ],
        Some(&file),
    );
    assert_eq!(
        c.overrides.get("client.rack").map(String::as_str),
        Some("from-var")
    );
    assert_eq!(c.overrides.get("linger.ms").map(String::as_str), Some("7"));
    assert_eq!(c.bootstrap_servers, "var:9092");
    assert_eq!(c.sasl_username.as_deref(), Some("named-user"));
    let c = load(&[("KJOB_BOOTSTRAP_SERVERS", "named:9092")], Some(&file));
    assert_eq!(c.bootstrap_servers, "named:9092");
    // What the program sets afterwards wins over everything.
    let c = c.set("client.rack", "from-code");
    let cfg = c.client_config(&[("client.rack", "kjob-default")]);
    assert_eq!(cfg.get("client.rack"), Some("from-code"));
    // KJOB_KAFKA_CONFIG_FILE names the file; an explicit one wins.
    let path = file.display().to_string();
    let c = load(&[(CONFIG_FILE_ENV, path.as_str())], None);
    assert_eq!(c.bootstrap_servers, "file:9092");
    assert!(c.check().is_ok(), "{:?}", c.check());
    let other = temp_file("explicit", "client.rack=explicit\n");
    let c = load(&[(CONFIG_FILE_ENV, path.as_str())], Some(&other));
    assert_eq!(
        c.overrides.get("client.rack").map(String::as_str),
        Some("explicit")
    );
    assert_eq!(c.bootstrap_servers, DEFAULT_BOOTSTRAP_SERVERS);
    // A kjob default loses to a file's property.
    let c = load(&[], Some(&file));
    let cfg = c.client_config(&[("linger.ms", "1")]);
    assert_eq!(cfg.get("linger.ms"), Some("7"));
}

#[test]
fn unknown_or_invalid_properties_are_named_with_their_source() {
    let file = temp_file("unknown", "client.rack=r1\n# fine\nclient.rak=r1\n");
    let c = load(&[], Some(&file));
    let err = c.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("`client.rak`") && err.contains(&format!("{}:3", file.display())),
        "{err}"
    );
    let c = load(&[("KJOB_KAFKA_LINGER_MS", "soon")], None);
    let err = c.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("`linger.ms`") && err.contains("KJOB_KAFKA_LINGER_MS"),
        "{err}"
    );
    // A Java client's file: the librdkafka way is named.
    let file = temp_file(
        "jaas",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\" password=\"hunter2\";\n",
    );
    let c = load(&[], Some(&file));
    let err = c.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("sasl.jaas.config") && err.contains("sasl.username"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "a credential leaked: {err}");
    // A file that is not there: named, from check (and so from the
    // first codec), not a panic in from_env.
    let c = load(&[(CONFIG_FILE_ENV, "/nonexistent/kjob.properties")], None);
    let err = c.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("/nonexistent/kjob.properties"), "{err}");
    let codec = crate::codec::Codec::from_config(&c)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(codec.contains("/nonexistent/kjob.properties"), "{codec}");
}

#[test]
fn secret_property_names() {
    for k in [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "ssl.key.pem",
    ] {
        assert!(is_secret_property(k), "{k}");
    }
    for k in [
        "ssl.ca.location",
        "ssl.key.location",
        "sasl.username",
        "linger.ms",
    ] {
        assert!(!is_secret_property(k), "{k}");
    }
}

#[test]
fn the_default_client_id_names_group_host_and_pid_and_yields_to_the_users() {
    let id = client_id_for("billing-workers", "web-1.eu", 4242);
    assert_eq!(id, "kjob-billing-workers-web-1.eu-4242");
    assert_eq!(
        host_and_pid(&id, "billing-workers"),
        Some(("web-1.eu".to_string(), 4242))
    );
    // Odd characters are replaced, and the id still parses back.
    let odd = client_id_for("g rp/1", "h\u{202e}x", 7);
    assert_eq!(odd, "kjob-g_rp_1-h_x-7");
    assert_eq!(host_and_pid(&odd, "g rp/1"), Some(("h_x".to_string(), 7)));
    for other in [
        "rdkafka",
        "kjob-other-h-1",
        "kjob-billing-workers-h-x1",
        "kjob-billing-workers--1",
    ] {
        assert_eq!(host_and_pid(other, "billing-workers"), None, "{other}");
    }
    let mine = default_client_id("g");
    assert!(mine.starts_with("kjob-g-") && mine.ends_with(&format!("-{}", std::process::id())));
    // The worker passes it as a default: a client.id the user set wins.
    let cfg = KafkaConfig::new("b:9092", "http://r")
        .set("client.id", "billing-7")
        .client_config(&[("client.id", mine.as_str())]);
    assert_eq!(cfg.get("client.id"), Some("billing-7"));
    let cfg = KafkaConfig::new("b:9092", "http://r").client_config(&[("client.id", mine.as_str())]);
    assert_eq!(cfg.get("client.id"), Some(mine.as_str()));
}

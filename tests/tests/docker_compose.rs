//! The Docker setup users start from (`docker/`), checked without a Docker
//! engine: the compose file's healthchecks and start order, the addresses
//! it publishes against kjob's defaults, and the images' Dockerfiles.
//!
//! Why each rule: a `depends_on` that only waits for a container to *start*
//! lets the worker run its preflight before Apicurio answers, and it exits;
//! a worker without a restart policy then stays down; a broker advertising
//! an address kjob's defaults do not use makes `KafkaConfig::from_env()` on
//! the host connect and then fail on the advertised one.

use std::path::PathBuf;

use serde_norway::Value;

fn docker_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docker")
}

fn read(name: &str) -> String {
    let path = docker_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn compose() -> Value {
    serde_norway::from_str(&read("compose.yml")).unwrap_or_else(|e| panic!("compose.yml: {e}"))
}

fn services(compose: &Value) -> Vec<(String, &Value)> {
    let Some(map) = compose["services"].as_mapping() else {
        panic!("compose.yml has no services");
    };
    map.iter()
        .map(|(k, v)| (k.as_str().unwrap_or("?").to_string(), v))
        .collect()
}

/// `KEY: value` from a service's `environment` (map form).
fn env<'a>(service: &'a Value, key: &str) -> Option<&'a str> {
    service["environment"].get(key).and_then(Value::as_str)
}

fn port_of(address: &str) -> &str {
    address.rsplit(':').next().unwrap_or("")
}

#[test]
fn every_service_has_a_healthcheck() {
    let compose = compose();
    for (name, service) in services(&compose) {
        let test = &service["healthcheck"]["test"];
        let has_test = match test {
            Value::Sequence(s) => s.len() >= 2,
            Value::String(s) => !s.trim().is_empty(),
            _ => false,
        };
        assert!(has_test, "service `{name}` has no healthcheck test");
        assert!(
            service["healthcheck"]["disable"].as_bool() != Some(true),
            "service `{name}` disables its healthcheck"
        );
    }
}

#[test]
fn every_dependency_waits_until_healthy() {
    let compose = compose();
    let names: Vec<String> = services(&compose).into_iter().map(|(n, _)| n).collect();
    let mut edges = 0;
    for (name, service) in services(&compose) {
        match &service["depends_on"] {
            Value::Null => {}
            Value::Mapping(deps) => {
                for (dep, how) in deps {
                    let dep = dep.as_str().unwrap_or("?");
                    assert!(
                        names.iter().any(|n| n == dep),
                        "`{name}` depends on unknown `{dep}`"
                    );
                    assert_eq!(
                        how["condition"].as_str(),
                        Some("service_healthy"),
                        "`{name}` starts before `{dep}` is healthy"
                    );
                    edges += 1;
                }
            }
            other => panic!(
                "`{name}`: depends_on as a list waits only for the start, not the health: {other:?}"
            ),
        }
    }
    assert!(
        edges >= 3,
        "the worker waits for kafka, registry and postgres"
    );
}

#[test]
fn the_worker_restarts_and_is_ready_on_the_port_it_serves() {
    let compose = compose();
    let worker = &compose["services"]["worker"];
    let restart = worker["restart"].as_str().unwrap_or("no");
    assert!(
        matches!(restart, "always" | "unless-stopped" | "on-failure")
            || restart.starts_with("on-failure:"),
        "worker restart policy is `{restart}`"
    );
    let metrics = env(worker, "KJOB_METRICS_ADDR").unwrap_or("");
    assert!(
        metrics.starts_with("0.0.0.0:"),
        "the endpoint must listen beyond loopback: {metrics}"
    );
    let test = format!("{:?}", worker["healthcheck"]["test"]);
    assert!(
        test.contains("/readyz") && test.contains(port_of(metrics)),
        "{test}"
    );
    let depends = &worker["depends_on"];
    for dep in ["kafka", "registry", "postgres"] {
        assert!(depends.get(dep).is_some(), "worker does not wait for {dep}");
    }
}

#[test]
fn published_addresses_are_kjobs_defaults() {
    let compose = compose();
    let kafka = &compose["services"]["kafka"];
    let advertised = env(kafka, "KAFKA_ADVERTISED_LISTENERS").unwrap_or("");
    let default = kjob::config::DEFAULT_BOOTSTRAP_SERVERS;
    assert!(
        advertised
            .split(',')
            .any(|l| l.ends_with(&format!("://{default}"))),
        "Kafka advertises {advertised}, kjob connects to {default}"
    );
    let published = |service: &Value| -> Vec<String> {
        service["ports"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|p| p.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        published(kafka)
            .iter()
            .any(|p| p.starts_with(&format!("{default}:"))),
        "{:?}",
        published(kafka)
    );
    // http://127.0.0.1:8081/apis/ccompat/v7 -> 127.0.0.1:8081
    let registry = kjob::config::DEFAULT_SCHEMA_REGISTRY_URL
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("");
    let reg = &compose["services"]["registry"];
    assert!(
        published(reg)
            .iter()
            .any(|p| p.starts_with(&format!("{registry}:"))),
        "{:?} does not publish {registry}",
        published(reg)
    );
    // Containers reach the services by name on the compose network.
    let worker = &compose["services"]["worker"];
    assert_eq!(env(worker, "KJOB_BOOTSTRAP_SERVERS"), Some("kafka:19092"));
    assert!(advertised.contains("//kafka:19092"));
}

#[test]
fn no_comment_calls_kip_848_the_default() {
    assert_eq!(kjob::GroupProtocol::default(), kjob::GroupProtocol::Classic);
    let text = read("compose.yml") + &read("README.md");
    for line in text.lines() {
        let l = line.to_ascii_lowercase();
        if l.contains("kip-848") && l.contains("default") {
            assert!(l.contains("classic"), "stale: {line}");
        }
    }
}

/// The instructions of the last stage (`FROM` to the end): the runtime image.
fn runtime_stage(dockerfile: &str) -> String {
    let text = read(dockerfile);
    let start = text.rfind("\nFROM ").unwrap_or(0);
    text[start..].to_string()
}

#[test]
fn the_worker_image_exposes_its_endpoint_checks_readyz_and_installs_only_what_it_links() {
    let stage = runtime_stage("worker.Dockerfile");
    let expose = stage
        .lines()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .unwrap_or_else(|| panic!("no EXPOSE in the runtime stage"));
    assert_eq!(expose.trim(), "9464");
    assert!(stage.contains("KJOB_METRICS_ADDR=0.0.0.0:9464"));
    let healthcheck = stage
        .split("HEALTHCHECK")
        .nth(1)
        .unwrap_or_else(|| panic!("no HEALTHCHECK"));
    assert!(healthcheck.contains("/readyz") && healthcheck.contains("9464"));
    for dockerfile in ["worker.Dockerfile", "cli.Dockerfile"] {
        let stage = runtime_stage(dockerfile);
        // The default features link glibc and zlib only (see the comment in
        // the Dockerfile): no OpenSSL, SASL, zstd or curl at run time.
        let installed: Vec<&str> = stage
            .split("apt-get install")
            .skip(1)
            .flat_map(|rest| rest.split("&&").next().unwrap_or("").split_whitespace())
            .filter(|w| !w.starts_with('-') && *w != "\\")
            .collect();
        assert_eq!(
            installed,
            ["zlib1g"],
            "{dockerfile} runtime installs {installed:?}"
        );
        assert!(stage.contains("USER "), "{dockerfile} runs as root");
    }
}

#[test]
fn the_cli_image_builds_the_kjob_binary_beside_the_worker_image() {
    let text = read("cli.Dockerfile");
    assert!(
        text.contains("-p kjob-cli"),
        "cli.Dockerfile builds another package"
    );
    assert!(runtime_stage("cli.Dockerfile").contains("ENTRYPOINT [\"/usr/local/bin/kjob\"]"));
    assert!(docker_dir().join("cli.Dockerfile.dockerignore").exists());
    assert!(read("README.md").contains("cli.Dockerfile"));
}

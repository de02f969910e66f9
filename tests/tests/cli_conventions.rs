//! What every `kjob` command shares, through the real binary against the
//! real stack: `--help`, exit codes by kind, a closed pipe, a wrong
//! `--bootstrap-server`, `--json` everywhere, and librdkafka properties from
//! a `--command-config` file and `KJOB_KAFKA_<PROPERTY>` variables (also in
//! a worker binary).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kjob::codec::Codec;
use kjob::KafkaConfig;
use kjob_integration_tests::*;

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(KJOB, config, args)
}

fn ok(config: &KafkaConfig, args: &[&str]) -> String {
    kjob_ok(KJOB, config, args)
}

fn expect(o: &CliOut, code: i32, needles: &[&str], what: &str) {
    assert_eq!(
        o.code, code,
        "{what}: expected exit {code}, got {}: {}{}",
        o.code, o.stdout, o.stderr
    );
    for n in needles {
        assert!(
            o.stderr.contains(n),
            "{what}: stderr lacks `{n}`: {}",
            o.stderr
        );
    }
}

fn parse_json(what: &str, out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {out}"))
}

#[test]
fn help_opens_with_one_line_then_every_verb_and_the_exit_codes() {
    let o = run_kjob_env(KJOB, &["--help"], &[], None);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let first = o.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("kjob: operate background jobs on Apache Kafka"),
        "{first}"
    );
    assert!(!o.stdout.contains("clap") && !o.stdout.contains("handler crates"));
    let commands: String = o
        .stdout
        .split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("Options:").next())
        .unwrap_or_default()
        .to_string();
    // Every verb clap defines, not a list kept beside it.
    let verbs: Vec<String> = <kjob_cli::Cli as clap::CommandFactory>::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(verbs.len() >= 14, "{verbs:?}");
    for verb in &verbs {
        assert!(
            commands.lines().any(|l| l.trim_start().starts_with(verb)),
            "`{verb}` is not listed: {commands}"
        );
    }
    for code in ["EXIT CODES", "2  usage", "3  not found", "4  unreachable"] {
        assert!(o.stdout.contains(code), "help lacks `{code}`: {}", o.stdout);
    }
}

/// A Confluent-registered schema directory with one contract.
fn contract_dir(name: &str, version: u32, fields: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique("kjob-schemas"));
    std::fs::create_dir_all(&dir).expect("schema dir");
    std::fs::write(
        dir.join(format!("{name}.v{version}.avsc")),
        format!(r#"{{"type":"record","name":"Contract","fields":[{fields}]}}"#),
    )
    .expect("writing the contract");
    dir
}

#[test]
fn schema_check_tells_incompatible_unreachable_not_found_and_usage_apart() {
    let config = ensure_stack();
    let name = unique("exitcodes");
    let v1 = contract_dir(&name, 1, r#"{"name":"id","type":"string"}"#);
    ok(
        &config,
        &[
            "schema",
            "register",
            "--dir",
            v1.to_str().unwrap_or_default(),
        ],
    );
    // v2 adds a field without a default: BACKWARD-incompatible.
    let v2 = contract_dir(
        &name,
        2,
        r#"{"name":"id","type":"string"},{"name":"note","type":"string"}"#,
    );
    let dir = v2.to_str().unwrap_or_default();
    let incompatible = kjob(&config, &["schema", "check", "--dir", dir]);
    expect(&incompatible, 1, &["incompatibilit"], "incompatible");
    assert!(
        incompatible.stdout.contains("INCOMPATIBLE"),
        "{}",
        incompatible.stdout
    );
    let json = kjob(&config, &["schema", "check", "--dir", dir, "--json"]);
    assert_eq!(json.code, 1);
    let v = parse_json("schema check --json", &json.stdout);
    assert_eq!(v["incompatibilities"], 1);
    assert_eq!(v["contracts"][0]["result"], "incompatible");
    assert_eq!(v["contracts"][0]["incompatibilities"][0]["version"], 1);

    let down = KafkaConfig::new(
        config.bootstrap_servers.clone(),
        "http://127.0.0.1:1/apis/ccompat/v7",
    );
    expect(
        &kjob(&down, &["schema", "check", "--dir", dir]),
        4,
        &["127.0.0.1:1"],
        "registry down",
    );
    expect(
        &kjob(
            &config,
            &["schema", "check", "--dir", "/nonexistent/schemas"],
        ),
        3,
        &["/nonexistent/schemas"],
        "no such directory",
    );
    expect(
        &kjob(
            &config,
            &[
                "schema",
                "check",
                "--dir",
                dir,
                "--compatibility",
                "sideways",
            ],
        ),
        2,
        &["sideways"],
        "usage",
    );
    // The v1 files check clean.
    ok(
        &config,
        &["schema", "check", "--dir", v1.to_str().unwrap_or_default()],
    );
}

/// Runs `kjob args` with stdout closed before it prints a byte.
fn with_closed_stdout(config: &KafkaConfig, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(KJOB)
        .args(args)
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kjob");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("waiting for kjob");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_every_command_quietly() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("pipe");
    ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--execute",
        ],
    );
    // Records in its DLQ, so `dlq list` has rows to print.
    for i in 0..3 {
        produce_raw(&config, &format!("{topic}.dlq"), 0, &format!("k{i}"), b"x");
    }
    let group = unique("g");
    commit_offsets(&config, &group, &topic, &[(0, 0)]);
    for args in [
        vec!["dlq", "list", "--topic", topic.as_str()],
        vec!["dlq", "list", "--topic", topic.as_str(), "--json"],
        vec![
            "status",
            "--group",
            group.as_str(),
            "--topic",
            topic.as_str(),
        ],
        vec!["topics", "list"],
        vec!["topics", "describe", "--topic", topic.as_str()],
        vec!["groups", "list"],
        vec!["groups", "describe", "--group", group.as_str()],
        vec![
            "replay",
            "--group",
            group.as_str(),
            "--topic",
            topic.as_str(),
            "--to-earliest",
        ],
        vec!["--help"],
        vec!["dlq", "--help"],
    ] {
        let (code, stderr) = with_closed_stdout(&config, &args);
        assert_eq!(
            code, 0,
            "kjob {args:?} with a closed stdout: exit {code}: {stderr}"
        );
        assert!(
            stderr.trim().is_empty(),
            "kjob {args:?} with a closed stdout said: {stderr}"
        );
    }
    // And the shell's way: `kjob dlq list | head -1` under pipefail.
    let piped = Command::new("bash")
        .args([
            "-c",
            &format!("set -o pipefail; '{KJOB}' dlq list --topic '{topic}' | head -1"),
        ])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .output()
        .expect("running bash");
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert!(!String::from_utf8_lossy(&piped.stderr).contains("panicked"));
}

/// A TCP port that accepts connections and never answers: a broker that
/// hangs (or a firewall that swallows packets after the handshake).
fn silent_listener() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding");
    let addr = listener.local_addr().expect("address");
    listener.set_nonblocking(true).expect("non-blocking");
    let handle = std::thread::spawn(move || {
        let mut held = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok((s, _)) = listener.accept() {
                held.push(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    (addr, handle)
}

#[test]
fn a_wrong_bootstrap_server_is_one_line_naming_the_address_and_the_cause() {
    let registry = ensure_stack().schema_registry_url;
    let (silent, _keep) = silent_listener();
    let silent = silent.to_string();
    for (bootstrap, timeout, cause, within) in [
        (
            "127.0.0.1:1",
            "5s",
            "connection refused",
            Duration::from_secs(5),
        ),
        (
            "no-such-host.invalid:9092",
            "5s",
            "does not resolve",
            Duration::from_secs(5),
        ),
        (
            silent.as_str(),
            "2s",
            "timed out",
            Duration::from_millis(4500),
        ),
    ] {
        for args in [
            vec!["status", "--group", "g", "--topic", "t"],
            vec!["dlq", "list", "--topic", "t"],
            vec!["groups", "list"],
        ] {
            let mut full = vec!["--bootstrap-server", bootstrap, "--timeout", timeout];
            full.extend(args.iter().copied());
            let started = Instant::now();
            let o = run_kjob_env(
                KJOB,
                &full,
                &[("KJOB_SCHEMA_REGISTRY_URL", registry.as_str())],
                None,
            );
            let took = started.elapsed();
            expect(&o, 4, &[bootstrap, cause], &format!("{full:?}"));
            assert_eq!(o.stderr.trim().lines().count(), 1, "one line: {}", o.stderr);
            assert!(
                !o.stderr.contains("BrokerTransportFailure"),
                "librdkafka's code, not the cause: {}",
                o.stderr
            );
            assert!(took < within, "{full:?} took {took:?}");
            if cause == "timed out" {
                assert!(
                    took >= Duration::from_millis(1500),
                    "{full:?} gave up early: {took:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_means_output_everywhere_with_named_fields() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("json");
    let group = unique("g");
    // topics create --json (a dry run, then for real).
    let dry = parse_json(
        "topics create --json",
        &ok(
            &config,
            &[
                "topics",
                "create",
                "--topic",
                &topic,
                "--partitions",
                "2",
                "--tiers",
                "1s",
                "--json",
            ],
        ),
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["topics"][0]["state"], "would be created");
    let made = parse_json(
        "topics create --execute --output json",
        &ok(
            &config,
            &[
                "topics",
                "create",
                "--topic",
                &topic,
                "--partitions",
                "2",
                "--tiers",
                "1s",
                "--execute",
                "--output",
                "json",
            ],
        ),
    );
    assert_eq!(made["topics"][1]["role"], "retry tier");
    assert_eq!(made["topics"][1]["state"], "created");
    Codec::from_config(&config)
        .expect("codec")
        .register::<TestJob>(&topic)
        .await
        .expect("registering the contract");

    // enqueue: --data, --data-file, stdin; its result as JSON.
    let one = parse_json(
        "enqueue --json",
        &ok(
            &config,
            &[
                "enqueue",
                "--topic",
                &topic,
                "--key",
                "k0",
                "--json",
                "--data",
                r#"{"key":"k0","seq":0,"behaviour":"ok"}"#,
            ],
        ),
    );
    assert_eq!(one["jobs"][0]["topic"], topic.as_str());
    assert!(one["jobs"][0]["offset"].is_i64(), "{one}");
    let file = std::env::temp_dir().join(unique("jobs"));
    std::fs::write(
        &file,
        "{\"key\":\"k1\",\"seq\":1,\"behaviour\":\"ok\"}\n{\"key\":\"k2\",\"seq\":2,\"behaviour\":\"ok\"}\n",
    )
    .expect("writing jobs");
    let from_file = parse_json(
        "enqueue --data-file --json",
        &ok(
            &config,
            &[
                "enqueue",
                "--topic",
                &topic,
                "--key-field",
                "key",
                "--json",
                "--data-file",
                file.to_str().unwrap_or_default(),
            ],
        ),
    );
    assert_eq!(from_file["jobs"].as_array().map(Vec::len), Some(2));
    let stdin = run_kjob_env(
        KJOB,
        &["enqueue", "--topic", &topic, "--key-field", "key"],
        &[
            ("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers),
            ("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url),
        ],
        Some("{\"key\":\"k3\",\"seq\":3,\"behaviour\":\"ok\"}\n"),
    );
    assert_eq!(stdin.code, 0, "{}", stdin.stderr);
    assert!(
        stdin.stdout.contains("line 1: enqueued"),
        "{}",
        stdin.stdout
    );
    // The old form still works for one release, with a warning.
    let old = kjob(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--json",
            r#"{"key":"k4","seq":4,"behaviour":"ok"}"#,
        ],
    );
    assert_eq!(old.code, 0, "{}", old.stderr);
    assert!(
        old.stderr.contains("deprecated") && old.stderr.contains("--data"),
        "{}",
        old.stderr
    );
    assert_eq!(read_all(&config, &topic).len(), 5);
    let dry = parse_json(
        "enqueue --dry-run --json",
        &ok(
            &config,
            &[
                "enqueue",
                "--topic",
                &topic,
                "--dry-run",
                "--json",
                "--data",
                r#"{"key":"k","seq":9,"behaviour":"ok"}"#,
            ],
        ),
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["jobs"], 1);

    // status: objects with named fields, partition_lag included.
    commit_offsets(&config, &group, &topic, &[(0, 0), (1, 0)]);
    let status = parse_json(
        "status --json",
        &ok(
            &config,
            &["status", "--group", &group, "--topic", &topic, "--json"],
        ),
    );
    let main = &status["topics"][0];
    assert_eq!(main["role"], "main");
    assert_eq!(main["lag"], 5);
    let lags = main["partition_lag"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(lags.len(), 2);
    assert!(
        lags.iter()
            .all(|p| p["partition"].is_i64() && p["lag"].is_i64()),
        "{main}"
    );
    let total: i64 = lags.iter().filter_map(|p| p["lag"].as_i64()).sum();
    assert_eq!(total, 5);
    assert_eq!(status["dlq"]["exists"], true);

    // replay, dlq, groups, topics: JSON objects (or an array of them).
    let replay = parse_json(
        "replay --json",
        &ok(
            &config,
            &[
                "replay",
                "--group",
                &group,
                "--topic",
                &topic,
                "--to-latest",
                "--json",
            ],
        ),
    );
    assert_eq!(replay["dry_run"], true);
    assert_eq!(replay["rows"][0]["topic"], topic.as_str());
    assert!(replay["rows"][0]["target"].is_i64());
    assert_eq!(replay["replayed"], 0);
    produce_raw(&config, &format!("{topic}.dlq"), 0, "dead", b"not avro");
    let list = parse_json(
        "dlq list --json",
        &ok(&config, &["dlq", "list", "--topic", &topic, "--json"]),
    );
    assert_eq!(list[0]["partition"], 0);
    assert_eq!(list[0]["status"], "unresolved");
    let retry = parse_json(
        "dlq retry --json",
        &ok(&config, &["dlq", "retry", "--topic", &topic, "--json"]),
    );
    assert_eq!(retry["dry_run"], true);
    assert_eq!(retry["target_topic"], format!("{topic}.retry.1s"));
    // Not Avro: a re-drive would come straight back, so it is held back.
    assert_eq!(
        retry["records"].as_array().map(Vec::len),
        Some(0),
        "{retry}"
    );
    assert_eq!(retry["held"][0]["key"], "dead");
    assert!(
        retry["held"][0]["held_because"]
            .as_str()
            .is_some_and(|r| r.contains("wire format")),
        "{retry}"
    );
    let resolve = parse_json(
        "dlq resolve --json",
        &ok(
            &config,
            &[
                "dlq", "resolve", "--topic", &topic, "0:0", "--reason", "test", "--json",
            ],
        ),
    );
    assert_eq!(resolve["dry_run"], true);
    assert_eq!(resolve["matched"], 1);
    let groups = parse_json(
        "groups list --json",
        &ok(&config, &["groups", "list", "--json"]),
    );
    assert!(
        groups["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["group"] == group.as_str())),
        "{groups}"
    );
    let described = parse_json(
        "groups describe --json",
        &ok(
            &config,
            &["groups", "describe", "--group", &group, "--json"],
        ),
    );
    assert_eq!(described["partitions"][0]["topic"], topic.as_str());
    assert!(described["partitions"][0]["lag"].is_i64());
    let topics = parse_json(
        "topics list --json",
        &ok(&config, &["topics", "list", "--json"]),
    );
    assert!(
        topics["topics"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["topic"] == format!("{topic}.dlq")
                && t["role"] == "dlq"
                && t["route"] == topic.as_str())),
        "{topics}"
    );
}

fn write_properties(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.properties", unique("kjob-client")));
    std::fs::write(&path, text).expect("writing the properties file");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_properties_come_from_a_file_and_kjob_kafka_variables() {
    init_logging();
    let config = ensure_stack();
    let registry = config.schema_registry_url.as_str();
    let topic = unique("props");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;

    // The CLI: the file names the cluster (no KJOB_BOOTSTRAP_SERVERS here).
    let good = write_properties(&format!(
        "# as for kafka-consumer-groups --command-config\nbootstrap.servers={}\nclient.rack=r1\nsocket.keepalive.enable = true\n",
        config.bootstrap_servers
    ));
    let good = good.to_str().unwrap_or_default();
    let o = run_kjob_env(
        KJOB,
        &[
            "--command-config",
            good,
            "topics",
            "describe",
            "--topic",
            &topic,
        ],
        &[("KJOB_SCHEMA_REGISTRY_URL", registry)],
        None,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains(&topic), "{}", o.stdout);
    // ... and really is read: a file naming a closed port fails naming it.
    let wrong = write_properties("bootstrap.servers=127.0.0.1:1\n");
    let o = run_kjob_env(
        KJOB,
        &[
            "--command-config",
            wrong.to_str().unwrap_or_default(),
            "groups",
            "list",
        ],
        &[],
        None,
    );
    expect(
        &o,
        4,
        &["127.0.0.1:1", "connection refused"],
        "file's bootstrap",
    );
    // KJOB_KAFKA_CONFIG_FILE names it too; --bootstrap-server wins over it.
    let o = run_kjob_env(
        KJOB,
        &[
            "--bootstrap-server",
            &config.bootstrap_servers,
            "groups",
            "list",
        ],
        &[("KJOB_KAFKA_CONFIG_FILE", wrong.to_str().unwrap_or_default())],
        None,
    );
    assert_eq!(o.code, 0, "the flag wins over the file: {}", o.stderr);
    // An unknown property, and a value librdkafka refuses: usage, named,
    // with where they were set.
    let typo = write_properties("client.rack=r1\nclient.rak=r1\n");
    let typo_path = typo.to_str().unwrap_or_default();
    let o = run_kjob_env(
        KJOB,
        &["--command-config", typo_path, "groups", "list"],
        &[("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)],
        None,
    );
    expect(
        &o,
        2,
        &["client.rak", &format!("{typo_path}:2")],
        "unknown property",
    );
    let o = run_kjob_env(
        KJOB,
        &["groups", "list"],
        &[
            ("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers),
            ("KJOB_KAFKA_LINGER_MS", "soon"),
        ],
        None,
    );
    expect(
        &o,
        2,
        &["linger.ms", "KJOB_KAFKA_LINGER_MS"],
        "invalid value",
    );
    let o = run_kjob_env(
        KJOB,
        &[
            "--command-config",
            "/nonexistent/client.properties",
            "groups",
            "list",
        ],
        &[],
        None,
    );
    expect(&o, 2, &["/nonexistent/client.properties"], "missing file");

    // A worker binary: KJOB_KAFKA_CONFIG_FILE and KJOB_KAFKA_<PROPERTY>
    // reach its consumer, the variable winning over the file; its member is
    // seen under that client.id.
    let file_id = unique("from-file");
    let var_id = unique("from-variable");
    let worker_file = write_properties(&format!("client.id={file_id}\nclient.rack=r1\n"));
    let record = std::env::temp_dir().join(unique("props-record"));
    let spawn = |client_id: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_test-worker"));
        cmd.env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
            .env("KJOB_SCHEMA_REGISTRY_URL", registry)
            .env("KJOB_TEST_TOPIC", &topic)
            .env("KJOB_TEST_GROUP", &group)
            .env("KJOB_TEST_RECORD", &record)
            .env("KJOB_KAFKA_CONFIG_FILE", &worker_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(id) = client_id {
            cmd.env("KJOB_KAFKA_CLIENT_ID", id);
        }
        cmd.spawn().expect("starting the worker")
    };
    for (client_id, expected) in [
        (None, file_id.as_str()),
        (Some(var_id.as_str()), var_id.as_str()),
    ] {
        let mut worker = spawn(client_id);
        let mut seen = serde_json::Value::Null;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let o = kjob(
                &config,
                &["groups", "describe", "--group", &group, "--json"],
            );
            if o.code == 0 {
                seen = parse_json("groups describe", &o.stdout);
                if seen["members"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["client_id"] == expected))
                {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let _ = worker.kill();
        let _ = worker.wait();
        assert!(
            seen["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["client_id"] == expected)),
            "the worker's member has client.id {expected}: {seen}"
        );
        // Wait for the killed member to leave before the next one joins.
        eventually(Duration::from_secs(30), "the member gone", || {
            let o = kjob(
                &config,
                &["groups", "describe", "--group", &group, "--json"],
            );
            o.code == 0
                && parse_json("groups describe", &o.stdout)["members"]
                    .as_array()
                    .is_none_or(|m| m.is_empty())
        })
        .await;
    }
    // A worker given an unknown property stops at start, naming it.
    let bad = Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", registry)
        .env("KJOB_TEST_TOPIC", &topic)
        .env("KJOB_TEST_GROUP", &group)
        .env("KJOB_TEST_RECORD", &record)
        .env("KJOB_KAFKA_CLIENT_RAK", "r1")
        .output()
        .expect("running the worker");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{said}");
    assert!(
        said.contains("client.rak") && said.contains("KJOB_KAFKA_CLIENT_RAK"),
        "{said}"
    );
}

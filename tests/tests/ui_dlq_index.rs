//! The dashboard's DLQ index against the real broker, over HTTP: paging,
//! sorting, the counts per error class and per job, search in key, job id,
//! error and payload, re-drive and resolve of checked rows and of
//! everything matching (audited), new dead letters and audit entries
//! showing up without the DLQ being read again, and records deleted by
//! retention (the low watermark moved) leaving the index.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use kjob::KafkaConfig;
use kjob_integration_tests::*;

use crate::dashboard as support;
use support::{attr, audit, dashboard, session};

const CLASSES: [&str; 3] = ["permanent.invalid", "retryable.timeout", "bug.panic"];
const JOBS: [&str; 2] = ["mail", "pdf"];

/// Dead letter `i` goes to partition `i % 2` at offset `i / 2` of a fresh
/// DLQ, with key `order-{i:03}`, id `id-{i}`, error `boom {i}`, a payload
/// holding `customer-{i:03}`, class `CLASSES[i % 3]` and job `JOBS[i % 2]`.
fn produce_letters(config: &KafkaConfig, dlq: &str, range: std::ops::Range<usize>) {
    let p: ThreadedProducer<DefaultProducerContext> =
        config.rdkafka_config().create().expect("producer");
    for i in range {
        let id = format!("id-{i}");
        let error = format!("boom {i}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "kjob-job",
                value: Some(JOBS[i % 2]),
            })
            .insert(Header {
                key: "kjob-error-class",
                value: Some(CLASSES[i % 3]),
            })
            .insert(Header {
                key: "kjob-id",
                value: Some(&id),
            })
            .insert(Header {
                key: "kjob-error",
                value: Some(&error),
            })
            .insert(Header {
                key: "kjob-attempt",
                value: Some(&(1 + i % 4).to_string()),
            });
        let key = format!("order-{i:03}");
        let mut payload = vec![0u8, 0, 0, 0, 1, 0x18];
        payload.extend_from_slice(format!("customer-{i:03}").as_bytes());
        p.send(
            BaseRecord::to(dlq)
                .partition((i % 2) as i32)
                .key(&key)
                .payload(&payload)
                .headers(headers),
        )
        .map_err(|(e, _)| e)
        .expect("queueing a dead letter");
    }
    p.flush(Duration::from_secs(10)).expect("flushing");
}

fn at(i: usize) -> String {
    format!("{}:{}", i % 2, i / 2)
}

fn totals(page: &str, name: &str) -> usize {
    attr(page, "class=\"muted totals count\"", name)
        .parse()
        .expect("a number")
}

/// The `data-at` of every row, in page order.
fn rows(page: &str) -> Vec<String> {
    page.split("<tr data-at=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap_or_default().to_string())
        .collect()
}

/// The count beside a facet link (`data-class="..."` or `data-job="..."`).
fn facet(page: &str, marker: &str) -> usize {
    let from = page.find(marker).unwrap_or_else(|| panic!("no `{marker}`"));
    let rest = &page[from..];
    let n = rest.find("<td class=\"num\">").expect("a count") + "<td class=\"num\">".len();
    rest[n..]
        .split('<')
        .next()
        .unwrap_or_default()
        .parse()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dlq_index_pages_counts_searches_selects_and_follows_the_log() {
    let config = ensure_stack();
    let topic = unique("uidx");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 2).await;
    create_topic(&config, &dlq, 2).await;
    produce_letters(&config, &dlq, 0..120);
    let (_ui, base) = dashboard(&config, &["--allow-actions"]).await;
    let s = session(&base, &topic).await;
    let list = format!("/dlq?topic={topic}");
    let page = s.settled(&list, |p| totals(p, "data-stored") == 120).await;
    assert_eq!(totals(&page, "data-unresolved"), 120);
    assert_eq!(totals(&page, "data-read"), 120, "each record read once");

    // Counts first: per class and per job.
    assert!(page.find("by-class") < page.find("table class=\"dlq\""));
    for c in CLASSES {
        assert_eq!(facet(&page, &format!("data-class=\"{c}\"")), 40, "{c}");
    }
    assert_eq!(facet(&page, "data-job=\"mail\""), 60);
    let panics = s.get(&format!("{list}&class=bug.panic")).await;
    assert_eq!(totals(&panics, "data-matched"), 40);
    assert_eq!(
        facet(&panics, "data-job=\"pdf\""),
        20,
        "jobs within the class"
    );
    assert_eq!(
        facet(&panics, "data-class=\"permanent.invalid\""),
        40,
        "classes as if no class were chosen"
    );

    // Pages: 50, 50, 20; newest first by default; a key sort is stable.
    assert_eq!(rows(&page).len(), 50);
    assert_eq!(rows(&page)[0], at(119), "newest first");
    assert!(page.contains("rows 1–50 of 120"));
    let third = s.get(&format!("{list}&page=3")).await;
    assert_eq!(rows(&third).len(), 20);
    assert_eq!(rows(&third)[19], at(0));
    let mut by_key = Vec::new();
    for n in 1..=3 {
        by_key.extend(rows(
            &s.get(&format!("{list}&sort=key&dir=asc&page={n}")).await,
        ));
    }
    assert_eq!(by_key, (0..120).map(at).collect::<Vec<_>>(), "key order");
    let desc = s.get(&format!("{list}&sort=key&dir=desc&per=5")).await;
    assert_eq!(rows(&desc), (115..120).rev().map(at).collect::<Vec<_>>());

    // Search in key, job id, error text and payload.
    for (q, want) in [
        ("order-042", vec![at(42)]),
        ("id-77", vec![at(77)]),
        ("boom+105", vec![at(105)]),
        ("customer-008", vec![at(8)]),
    ] {
        let found = s.get(&format!("{list}&q={q}")).await;
        assert_eq!(rows(&found), want, "search {q}");
    }
    assert!(rows(&s.get(&format!("{list}&q=nowhere")).await).is_empty());

    // New dead letters arrive without the DLQ being read again.
    produce_letters(&config, &dlq, 120..126);
    let page = s.settled(&list, |p| totals(p, "data-stored") == 126).await;
    assert_eq!(
        totals(&page, "data-read"),
        126,
        "only the six new ones were read"
    );
    assert_eq!(rows(&page)[0], at(125));

    // Re-drive two checked rows to the main topic.
    let (status, preview) = s
        .post(
            "/dlq/redrive",
            &format!("topic={topic}&to=main&at={}&at={}", at(3), at(4)),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert!(
        preview.contains("2 record(s) would be re-driven"),
        "{preview}"
    );
    let (status, _) = s
        .post(
            "/dlq/redrive",
            &format!(
                "topic={topic}&to=main&rate=100&execute=1&at={},{}",
                at(3),
                at(4)
            ),
        )
        .await;
    assert_eq!(status, 303);
    eventually(
        Duration::from_secs(30),
        "two records on the main topic",
        || end_offsets(&config, &topic, 2).iter().sum::<i64>() == 2,
    )
    .await;
    // Resolve two other checked rows.
    let (status, body) = s
        .post(
            "/dlq/resolve",
            &format!("topic={topic}&at={}&at={}&reason=known+dup", at(5), at(6)),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("resolved 2 record(s)"), "{body}");
    let page = s
        .settled(&list, |p| totals(p, "data-unresolved") == 122)
        .await;
    assert_eq!(
        totals(&page, "data-read"),
        126,
        "audit entries are no re-read"
    );
    // A checked row already audited is refused, and nothing is audited.
    let (status, _) = s
        .post(
            "/dlq/resolve",
            &format!("topic={topic}&at={}&at={}&reason=x", at(7), at(5)),
        )
        .await;
    assert_eq!(status, 400);

    // Everything matching a search and a class.
    let (status, body) = s
        .post(
            "/dlq/resolve",
            &format!("topic={topic}&class=bug.panic&q=order-1&reason=panics+fixed"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // `order-1` is in the keys order-100 to order-125 only; bug.panic is
    // every third of them.
    let want = (100..126).filter(|i| i % 3 == 2).count();
    assert!(
        body.contains(&format!("resolved {want} record(s)")),
        "{body}"
    );

    let entries = audit(&config, &topic);
    let action = |i: usize| {
        entries
            .iter()
            .filter(|(k, _)| *k == at(i))
            .map(|(_, v)| {
                (
                    v["action"].as_str().unwrap_or_default().to_string(),
                    v["by"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        action(3),
        vec![("retried".to_string(), serde_json::json!("index-tester"))]
    );
    assert_eq!(
        action(5),
        vec![("resolved".to_string(), serde_json::json!("index-tester"))]
    );
    assert!(
        action(7).is_empty(),
        "the refused selection audited nothing"
    );
    assert_eq!(entries.len(), 4 + want);
    let all = s
        .settled(&format!("{list}&all=on"), |p| {
            totals(p, "data-unresolved") == 122 - want
        })
        .await;
    assert_eq!(totals(&all, "data-matched"), 126);

    // Retention: the first 10 records of partition 0 are deleted (the low
    // watermark moves to 10); their entries go, nothing is read again.
    let admin: AdminClient<DefaultClientContext> = config.rdkafka_config().create().expect("admin");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dlq, 0, Offset::Offset(10))
        .expect("offsets");
    admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("deleting records");
    let page = s
        .settled(&format!("{list}&all=on"), |p| {
            totals(p, "data-stored") == 116
        })
        .await;
    assert_eq!(
        totals(&page, "data-read"),
        126,
        "no re-read after retention"
    );
    let gone = s.get(&format!("{list}&all=on&q=order-000")).await;
    assert!(
        rows(&gone).is_empty(),
        "0:0 dropped with its partition's head"
    );
    let kept = s.get(&format!("{list}&all=on&q=order-020")).await;
    assert_eq!(rows(&kept), vec![at(20)], "0:10 is kept");
}

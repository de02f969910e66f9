use super::entry::payload_text;
use super::*;
use crate::dlq::store::Filter;
use kjob::headers::JobHeaders;

fn at(partition: i32, offset: i64) -> Coordinates {
    Coordinates { partition, offset }
}

fn letter<'a>(c: Coordinates, ts: i64, job: &str, class: &str, key: &'a str) -> Incoming<'a> {
    Incoming {
        at: c,
        timestamp_ms: Some(ts),
        key: Some(key.as_bytes()),
        headers: JobHeaders {
            job: Some(job.into()),
            error_class: Some(class.into()),
            id: Some(format!("id-{}-{}", c.partition, c.offset)),
            error: Some(format!("boom {key}")),
            attempt: Some(c.offset as u32 % 5),
            ..Default::default()
        },
        payload: Some(b"\0\0\0\0\x01\x14order-4711\x02ok"),
    }
}

fn index_of(n: i64) -> DlqIndex {
    let idx = DlqIndex::new("orders");
    let keys: Vec<String> = (0..n).map(|i| format!("k{:04}", (i * 37) % n)).collect();
    let batch = (0..n)
        .map(|i| {
            let class = if i % 3 == 0 {
                "permanent.invalid"
            } else {
                "retryable.timeout"
            };
            let job = if i % 2 == 0 { "mail" } else { "pdf" };
            letter(
                at((i % 2) as i32, i / 2),
                1_000 + i,
                job,
                class,
                &keys[i as usize],
            )
        })
        .collect();
    idx.add(batch);
    idx
}

fn q() -> Query {
    Query {
        limit: 10,
        ..Default::default()
    }
}

#[test]
fn an_entry_stays_small_and_keeps_its_fields() {
    assert!(
        std::mem::size_of::<Entry>() <= 64,
        "{}",
        std::mem::size_of::<Entry>()
    );
    let idx = index_of(1);
    let long = "x".repeat(500);
    let mut l = letter(at(0, 99), 5, "mail", "bug.panic", &long);
    l.headers.error = Some(format!("é{}", "y".repeat(300)));
    idx.add(vec![l]);
    let page = idx.query(&Query {
        search: Some("xxxx".into()),
        ..q()
    });
    let row = &page.rows[0];
    assert_eq!(row.key.as_deref().map(str::len), Some(KEY_BYTES));
    assert!(row.key_cut && row.error_cut);
    assert!(row.error.len() <= ERROR_BYTES && row.error.starts_with('é'));
    let (n, bytes) = idx.memory();
    assert_eq!(n, 2);
    assert!(
        bytes <= 2 * (FIXED_BYTES_PER_ENTRY + MAX_TEXT_BYTES),
        "{bytes}"
    );
}

#[test]
fn pages_sort_and_stay_stable() {
    let idx = index_of(100);
    let first = idx.query(&Query {
        sort: Sort::Time,
        desc: true,
        ..q()
    });
    assert_eq!(first.matched, 100);
    assert_eq!(first.rows.len(), 10);
    assert_eq!(first.rows[0].timestamp_ms, 1_099, "newest first");
    let last = idx.query(&Query {
        sort: Sort::Time,
        desc: true,
        offset: 95,
        ..q()
    });
    assert_eq!(last.rows.len(), 5);
    assert_eq!(last.rows[4].timestamp_ms, 1_000);
    // Every page of a key sort, put together, is the whole sorted set.
    let mut keys = Vec::new();
    for offset in (0..100).step_by(10) {
        let p = idx.query(&Query {
            sort: Sort::Key,
            offset,
            ..q()
        });
        keys.extend(p.rows.into_iter().map(|r| r.key.unwrap_or_default()));
    }
    let mut want = keys.clone();
    want.sort();
    assert_eq!(keys, want);
    assert_eq!(keys.len(), 100);
    let by_attempt = idx.query(&Query {
        sort: Sort::Attempts,
        desc: true,
        ..q()
    });
    assert!(by_attempt.rows.iter().all(|r| r.attempt == 4));
}

#[test]
fn counts_leave_out_their_own_filter() {
    let idx = index_of(30);
    let p = idx.query(&Query {
        filter: Filter {
            class: Some("permanent".into()),
            ..Default::default()
        },
        ..q()
    });
    assert_eq!(p.matched, 10);
    // Per class: every class, as if the class filter were not set.
    assert_eq!(
        p.by_class,
        vec![
            (Some("retryable.timeout".to_string()), 20),
            (Some("permanent.invalid".to_string()), 10)
        ]
    );
    // Per job: within the class filter.
    assert_eq!(
        p.by_job.iter().map(|(_, n)| n).sum::<usize>(),
        10,
        "{:?}",
        p.by_job
    );
}

#[test]
fn search_finds_key_id_error_and_payload_but_not_across_fields() {
    let idx = index_of(20);
    let find = |s: &str| {
        idx.query(&Query {
            search: Some(s.into()),
            ..q()
        })
        .matched
    };
    assert_eq!(find("k0007"), 1, "key");
    assert_eq!(find("id-1-3"), 1, "job id");
    assert_eq!(find("boom k0011"), 1, "error");
    assert_eq!(find("order-4711"), 20, "payload text");
    assert_eq!(find("nowhere"), 0);
    assert_eq!(find("k0007id"), 0, "no match across two fields");
}

#[test]
fn audit_entries_apply_in_either_order_and_tombstones_reopen() {
    let idx = DlqIndex::new("orders");
    let resolved = AuditEntry {
        action: "resolved".into(),
        by: "ann".into(),
        at_ms: 1,
        reason: Some("dup".into()),
        target: None,
    };
    // The audit record before its dead letter.
    idx.audit(vec![(at(0, 1), Some(resolved.clone()))]);
    idx.add(vec![
        letter(at(0, 0), 1, "mail", "permanent", "a"),
        letter(at(0, 1), 2, "mail", "permanent", "b"),
    ]);
    assert_eq!(idx.query(&q()).matched, 1);
    assert_eq!(idx.query(&q()).unresolved, 1);
    assert!(idx.check_unresolved(&[at(0, 0)]).is_ok());
    assert!(idx.check_unresolved(&[at(0, 1)]).is_err());
    assert!(idx.check_unresolved(&[at(0, 7)]).is_err());
    let all = idx.query(&Query {
        status: StatusFilter::All,
        ..q()
    });
    assert_eq!(all.matched, 2);
    assert!(all.rows.iter().any(|r| r.audit.as_ref() == Some(&resolved)));
    idx.audit(vec![(at(0, 1), None)]);
    assert_eq!(idx.query(&q()).matched, 2, "a tombstone reopens it");
    assert_eq!(idx.matching_unresolved(&q()), vec![at(0, 0), at(0, 1)]);
}

#[test]
fn retention_and_recreation_drop_entries() {
    let idx = index_of(20);
    assert_eq!(idx.drop_below(0, Some(4)), 4);
    assert_eq!(idx.drop_below(0, Some(4)), 0);
    assert_eq!(idx.query(&q()).stored, 16);
    assert!(idx.check_unresolved(&[at(0, 3)]).is_err());
    assert!(idx.check_unresolved(&[at(0, 4)]).is_ok());
    assert_eq!(idx.drop_below(1, None), 10);
    assert_eq!(idx.query(&q()).stored, 6);
    // Re-adding what is held is a no-op.
    idx.add(vec![letter(at(0, 5), 1, "mail", "permanent", "again")]);
    assert_eq!(idx.query(&q()).stored, 6);
}

#[test]
fn payload_text_keeps_printable_runs() {
    assert_eq!(
        payload_text(b"\0\0\0\0\x01\x14order-4711\x02ok\x06pdf"),
        "order-4711 pdf"
    );
    assert_eq!(payload_text(b""), "");
    assert_eq!(payload_text(b"{\"a\":1}"), "{\"a\":1}");
}

#[test]
fn the_index_filters_as_the_cli_filter_does() {
    use crate::dlq::store::DeadLetter;
    let classes = [
        "permanent",
        "permanent.invalid",
        "permanentx",
        "retryable.timeout",
    ];
    let jobs = ["mail", "mail.x", "pdf"];
    let idx = DlqIndex::new("orders");
    let mut letters = Vec::new();
    let mut batch = Vec::new();
    for i in 0..60i64 {
        let (class, job) = (classes[(i % 4) as usize], jobs[(i % 3) as usize]);
        let c = at(0, i);
        batch.push(letter(c, 1_000 + i * 10, job, class, "k"));
        letters.push(DeadLetter {
            at: c,
            key: Some("k".into()),
            headers: JobHeaders {
                job: Some(job.into()),
                error_class: Some(class.into()),
                ..Default::default()
            },
            payload: None,
            earlier: Vec::new(),
            timestamp_ms: Some(1_000 + i * 10),
        });
    }
    idx.add(batch);
    for job in [None, Some("mail"), Some("mail.x")] {
        for class in [
            None,
            Some("permanent"),
            Some("retryable"),
            Some("permanent.invalid"),
        ] {
            for (since, until) in [
                (None, None),
                (Some(1_100), None),
                (Some(1_100), Some(1_300)),
            ] {
                let filter = Filter {
                    job: job.map(str::to_string),
                    class: class.map(str::to_string),
                    since_ms: since,
                    until_ms: until,
                    ..Filter::default()
                };
                let want: Vec<Coordinates> = letters
                    .iter()
                    .filter(|d| filter.matches(d))
                    .map(|d| d.at)
                    .collect();
                let got = idx.matching_unresolved(&Query {
                    filter: filter.clone(),
                    ..q()
                });
                assert_eq!(got, want, "{filter:?}");
            }
        }
    }
}

/// One job id dead-lettered three times (the copies arriving out of
/// order, over two partitions): one row, the newest, with the two earlier
/// ones as its history; counted once; the earlier ones refused for an
/// action; and the same after retention drops the oldest.
#[test]
fn a_job_dead_lettered_again_is_one_row_with_its_history() {
    let idx = DlqIndex::new("orders");
    let same = |c: Coordinates, ts: i64| {
        let mut l = letter(c, ts, "mail", "permanent.invalid", "order-9");
        l.headers.id = Some("job-9".into());
        l
    };
    idx.add(vec![
        same(at(0, 5), 3_000),
        letter(at(0, 6), 2_500, "mail", "permanent.invalid", "order-8"),
    ]);
    idx.add(vec![same(at(1, 0), 1_000), same(at(0, 2), 2_000)]);
    let page = idx.query(&q());
    assert_eq!(page.matched, 2, "{:?}", page.rows);
    assert_eq!(page.unresolved, 2);
    let row = page
        .rows
        .iter()
        .find(|r| r.id == "job-9")
        .expect("the job's row");
    assert_eq!(row.at, at(0, 5), "the newest stands for the job");
    assert_eq!(row.earlier, vec![at(1, 0), at(0, 2)], "oldest first");
    let refused = idx
        .check_unresolved(&[at(0, 2)])
        .expect_err("an earlier copy");
    assert!(refused.contains("again at 0:5"), "{refused}");
    assert!(idx.check_unresolved(&[at(0, 5)]).is_ok());
    assert_eq!(
        idx.matching_unresolved(&q()),
        vec![at(0, 5), at(0, 6)],
        "everything matching acts on the job once"
    );
    // Retention removes the oldest copy: the history shrinks, the row stays.
    assert_eq!(idx.drop_below(1, Some(1)), 1);
    let page = idx.query(&q());
    let row = page.rows.iter().find(|r| r.id == "job-9").expect("row");
    assert_eq!((row.at, row.earlier.clone()), (at(0, 5), vec![at(0, 2)]));
    assert_eq!(page.unresolved, 2);
    // The same id under another key is another job (an id is a header).
    let mut other = letter(at(0, 9), 9_000, "mail", "permanent.invalid", "order-10");
    other.headers.id = Some("job-9".into());
    idx.add(vec![other]);
    let page = idx.query(&q());
    assert_eq!((page.matched, page.unresolved), (3, 3));
    let row = page.rows.iter().find(|r| r.at == at(0, 5)).expect("row");
    assert_eq!(row.earlier, vec![at(0, 2)], "untouched by the other key");
}

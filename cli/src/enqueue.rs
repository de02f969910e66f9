//! `kjob enqueue`: one job (`--data JSON`), a file of JSON lines
//! (`--data-file FILE`, `-` for stdin) or JSON lines on stdin, from the
//! command line.
//!
//! The value is encoded against the *latest* schema registered under the
//! topic's subject (`<topic>-value`), the one producers and workers agree
//! on. Every value is checked before anything is written: one bad line in a
//! file of ten thousand refuses the whole file, naming the line, the field
//! and the reason, so a script never half-enqueues a batch.

use std::io::{BufRead, IsTerminal};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::codec::{frame, subject_for_topic, Codec};
use kjob::headers::JobHeaders;
use kjob::json_avro::to_datum;
use kjob::producer::{new_job_id, Producer};
use kjob::registry::Registration;

#[derive(Args, Debug)]
pub(crate) struct EnqueueArgs {
    /// Main topic of the route (its subject `<topic>-value` has the schema).
    #[arg(long)]
    topic: String,
    /// The job as one JSON object (without --data or --data-file, the jobs
    /// are read from stdin, one JSON object per line).
    #[arg(long, conflicts_with = "data_file", value_name = "JSON")]
    data: Option<String>,
    /// A file of jobs, one JSON object per line (`-` for stdin); blank lines are skipped.
    #[arg(long, value_name = "FILE")]
    data_file: Option<String>,
    /// Record key (per-key ordering) for every job.
    #[arg(long, conflicts_with = "key_field")]
    key: Option<String>,
    /// Take each job's key from this top-level field of its JSON.
    #[arg(long)]
    key_field: Option<String>,
    /// Run the job(s) after this delay (`90s`, `10m`, `2h`, up to 30 days),
    /// through the route's delay topics.
    #[arg(long = "in", value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// With --in: through the shared delay buckets `NS.delay.<bucket>`
    /// (workers built with `SharedTiers::delay_buckets`; NS is their group
    /// unless they name another) instead of the route's own.
    #[arg(long, value_name = "NS", requires = "delay")]
    shared_delays: Option<String>,
    /// `kjob-job` header (the contract name); defaults to the topic.
    #[arg(long)]
    job: Option<String>,
    /// `kjob-tenant` header.
    #[arg(long)]
    tenant: Option<String>,
    /// Check every value against the schema and write nothing.
    #[arg(long)]
    dry_run: bool,
}

impl EnqueueArgs {
    /// Whether Kafka is needed: to write, or to check the delay topics of
    /// `--in` (a plain `--dry-run` only asks the registry).
    pub(crate) fn needs_kafka(&self) -> bool {
        !self.dry_run || self.delay.is_some()
    }
}

/// One job ready to write.
struct Ready {
    line: usize,
    key: Option<String>,
    payload: Vec<u8>,
}

fn read_lines(args: &EnqueueArgs) -> Result<Vec<(usize, String)>> {
    if let Some(json) = &args.data {
        return Ok(vec![(1, json.clone())]);
    }
    let path = args.data_file.as_deref().unwrap_or("-");
    let reader: Box<dyn BufRead> = if path == "-" {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            return Err(kjob_ops::problem::Problem::usage(
                "give the job with --data JSON, --data-file FILE, or as JSON lines on stdin",
            )
            .into());
        }
        Box::new(stdin.lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening --data-file {path}"))?,
        ))
    };
    let from = if path == "-" { "stdin" } else { path };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {from}"))?;
        if !line.trim().is_empty() {
            out.push((i + 1, line));
        }
    }
    Ok(out)
}

/// The newest schema registered for `subject`: its version, the schema
/// and its id.
async fn newest_schema(
    client: &kjob::registry::RegistryClient,
    subject: &str,
) -> Result<(u32, apache_avro::Schema, u32)> {
    let latest = client.versions(subject).await?.into_iter().max().ok_or_else(|| {
        kjob_ops::problem::Problem::not_found(format!(
            "no schema is registered under subject `{subject}`: register the contract first (`kjob schema register`, or start a producer or worker of the route)"
        ))
    })?;
    let text = client.version(subject, latest).await?;
    let schema = apache_avro::Schema::parse_str(&text)
        .map_err(|e| anyhow!("`{subject}` version {latest} does not parse as Avro: {e}"))?;
    // Registering the identical text answers the id it already has.
    let id = match client.register(subject, &text).await? {
        Registration::Id(id) => id,
        Registration::Refused { status, message } => {
            bail!("the registry would not give the id of `{subject}` version {latest} (HTTP {status}): {message}")
        }
    };
    Ok((latest, schema, id))
}

/// Every line checked against `schema` before any is written: the framed
/// jobs, or an error listing the lines that do not match.
fn check_lines(
    args: &EnqueueArgs,
    lines: &[(usize, String)],
    schema: &apache_avro::Schema,
    id: u32,
    subject: &str,
    latest: u32,
) -> Result<Vec<Ready>> {
    let mut ready = Vec::with_capacity(lines.len());
    let mut refused = Vec::new();
    for (line, text) in lines {
        let json: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                refused.push(format!("line {line}: not JSON: {e}"));
                continue;
            }
        };
        let key = match (&args.key, &args.key_field) {
            (Some(k), _) => Some(k.clone()),
            (None, Some(field)) => match json.get(field) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => {
                    refused.push(format!(
                        "line {line}: --key-field `{field}` is missing or not a string or number"
                    ));
                    continue;
                }
            },
            (None, None) => None,
        };
        match to_datum(schema, &json) {
            Ok(body) => ready.push(Ready {
                line: *line,
                key,
                payload: frame(id, &body),
            }),
            Err(m) => refused.push(format!(
                "line {line}: field {m} (schema `{subject}` version {latest})"
            )),
        }
    }
    if !refused.is_empty() {
        let shown = refused
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ");
        let more = refused.len().saturating_sub(20);
        let more = if more > 0 {
            format!("\n  ... and {more} more")
        } else {
            String::new()
        };
        bail!(
            "{} of {} value(s) do not match the schema; nothing was written:\n  {shown}{more}",
            refused.len(),
            lines.len()
        );
    }
    Ok(ready)
}

pub(crate) async fn run(ctx: &Ctx, args: EnqueueArgs) -> Result<()> {
    let config = &ctx.config;
    if let Some(d) = args.delay {
        kjob::delay::check_delay(d)
            .map_err(|e| kjob_ops::problem::Problem::usage(format!("--in: {e}")))?;
    }
    let lines = read_lines(&args)?;
    if lines.is_empty() {
        return Err(kjob_ops::problem::Problem::usage(
            "nothing to enqueue: the input has no JSON lines",
        )
        .into());
    }
    let codec = Codec::from_config(config)?;
    let subject = subject_for_topic(&args.topic);
    let (latest, schema, id) = newest_schema(codec.client(), &subject).await?;
    let ready = check_lines(&args, &lines, &schema, id, &subject, latest)?;
    let mut producer = Producer::new(config)?;
    if let Some(ns) = &args.shared_delays {
        producer = producer.shared_delay_buckets(ns);
    }
    let run_at_ms = args.delay.map(|d| {
        (SystemTime::now() + d)
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_millis() as i64)
            .unwrap_or(0)
    });
    if let Some(run_at) = run_at_ms {
        producer
            .check_delay_topics(&args.topic, kjob::clock::now_ms(), run_at)
            .await?;
    }
    if args.dry_run {
        if ctx.json() {
            return json(&json!({
                "dry_run": true,
                "subject": subject,
                "version": latest,
                "schema_id": id,
                "jobs": ready.len(),
            }));
        }
        outln!(
            "{} job(s) match `{subject}` version {latest} (schema id {id}); nothing written (--dry-run)",
            ready.len()
        )?;
        return Ok(());
    }
    let sends = ready.iter().map(|r| {
        let headers = JobHeaders {
            job: Some(args.job.clone().unwrap_or_else(|| args.topic.clone())),
            id: Some(new_job_id()),
            attempt: Some(1),
            tenant: args.tenant.clone(),
            ..Default::default()
        };
        let producer = &producer;
        let topic = args.topic.as_str();
        async move {
            let id = headers.id.clone().unwrap_or_default();
            let key = r.key.as_deref().map(str::as_bytes);
            let at = match run_at_ms {
                Some(run_at) => {
                    producer
                        .send_delayed(topic, key, &r.payload, headers, run_at)
                        .await
                }
                None => producer
                    .send_raw(topic, key, Some(&r.payload), headers.to_owned_headers())
                    .await
                    .map(|(p, o)| (topic.to_string(), p, o)),
            };
            (r.line, id, at)
        }
    });
    // Concurrently (librdkafka batches them), results in input order.
    let results = futures::future::join_all(sends).await;
    let mut failed = 0;
    let mut jobs = Vec::with_capacity(results.len());
    for (line, id, at) in results {
        match at {
            Ok((t, p, o)) => {
                if ctx.json() {
                    jobs.push(
                        json!({"line": line, "id": id, "topic": t, "partition": p, "offset": o}),
                    );
                } else {
                    outln!("line {line}: enqueued {id} at {t}:{p}:{o}")?;
                }
            }
            Err(e) => {
                failed += 1;
                if ctx.json() {
                    jobs.push(json!({"line": line, "id": id, "error": e.to_string()}));
                } else {
                    eprintln!("line {line}: NOT enqueued: {e}");
                }
            }
        }
    }
    if ctx.json() {
        json(&json!({
            "dry_run": false,
            "subject": subject,
            "version": latest,
            "schema_id": id,
            "jobs": jobs,
        }))?;
    }
    if failed > 0 {
        bail!(
            "{failed} of {} job(s) were not enqueued (see above); the others were",
            ready.len()
        );
    }
    Ok(())
}

//! Property-based fuzzing of everything a worker parses from a record it did
//! not write: the Confluent frame, the Avro body (through the same
//! `ReaderSchema::decode` the worker uses, both the direct path and the
//! schema-resolution path) and the `kjob-*` headers.
//!
//! ```text
//! cargo run --release -p kjob-benches --bin fuzz_decoder -- [CASES]   # default 1 000 000
//! ```
//!
//! No Kafka or registry is needed: writer schemas come from an in-memory
//! `SchemaSource`, which is exactly the seam the worker decodes through.
//! What it shows, per case:
//! * no panic (proptest catches one, shrinks the input and the run fails);
//! * no unbounded allocation: a counting allocator records the largest
//!   single allocation made while decoding, which must stay within 3 ×
//!   `kjob::codec::MAX_DECODE_ALLOCATION` even when a 10-byte record claims a
//!   string or collection of 2^62 bytes (strings, bytes and arrays are
//!   checked against the bound itself; a map's hash table rounds its
//!   capacity up to a power of two plus control bytes, hence the factor);
//! * every bad input classified: each `DecodeError` maps to a DLQ class
//!   (`DecodeError::class()` is `Some`), counted per class;
//! * headers: parsing never fails, and rebuilding the parsed set and parsing
//!   it again changes nothing (no duplicates, nothing lost on a hop).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use apache_avro::Schema;
use kjob::codec::{
    frame, DecodeError, ReaderSchema, SchemaSource, WriterSchema, MAX_DECODE_ALLOCATION,
};
use kjob::headers::{self, JobHeaders};
use kjob::Job;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rdkafka::message::{Header, OwnedHeaders};
use serde::{Deserialize, Serialize};

/// How far over the Avro library's bound one allocation may go: a map
/// checked at the bound reserves a hash table rounded up to the next power
/// of two of buckets (×8/7 load factor), plus control bytes.
const MAP_TABLE_FACTOR: usize = 3;

/// Records the largest single allocation request since the last reset.
struct CountingAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above; `ptr` came from this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// A contract with every length-prefixed Avro shape: strings, an array, a
/// map and an optional (union) field.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename = "FuzzJob")]
struct FuzzJob {
    key: String,
    seq: i64,
    tags: Vec<String>,
    attrs: HashMap<String, i64>,
    note: Option<String>,
}

const V1: &str = r#"{"type":"record","name":"FuzzJob","namespace":"kjob.fuzz","fields":[
  {"name":"key","type":"string"},
  {"name":"seq","type":"long"},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"attrs","type":{"type":"map","values":"long"}},
  {"name":"note","type":["null","string"],"default":null}]}"#;

/// A newer writer: one more field, with a default (the reader resolves it).
const V2: &str = r#"{"type":"record","name":"FuzzJob","namespace":"kjob.fuzz","fields":[
  {"name":"key","type":"string"},
  {"name":"seq","type":"long"},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"attrs","type":{"type":"map","values":"long"}},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"region","type":"string","default":"eu"}]}"#;

impl Job for FuzzJob {
    const NAME: &'static str = "kjob.fuzz.job";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = V1;
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// Schema ids 1 (= the reader: direct path) and 2 (resolution path); any
/// other id is unknown, as a registry would say.
struct Schemas(HashMap<u32, Arc<Schema>>);

impl SchemaSource for Schemas {
    fn writer(&self, id: u32) -> futures::future::BoxFuture<'_, Result<WriterSchema, DecodeError>> {
        let found = self.0.get(&id).cloned();
        Box::pin(async move {
            found
                .map(WriterSchema::Owned)
                .ok_or(DecodeError::UnknownSchema {
                    id,
                    message: "not in the fuzz store".into(),
                })
        })
    }
}

/// Avro's zig-zag varint, for building hostile length prefixes.
fn zigzag(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return out;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

fn encode(schema: &Schema, job: &FuzzJob, v2: bool) -> Vec<u8> {
    let mut value = apache_avro::to_value(job).unwrap_or(apache_avro::types::Value::Null);
    if v2 {
        if let apache_avro::types::Value::Record(fields) = &mut value {
            fields.push((
                "region".into(),
                apache_avro::types::Value::String("us".into()),
            ));
        }
    }
    let value = value
        .resolve(schema)
        .unwrap_or(apache_avro::types::Value::Null);
    apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .unwrap_or_default()
}

fn job_strategy() -> impl Strategy<Value = FuzzJob> {
    (
        ".{0,12}",
        any::<i64>(),
        prop::collection::vec(".{0,6}", 0..4),
        prop::collection::hash_map("[a-z]{1,4}", any::<i64>(), 0..4),
        prop::option::of(".{0,8}"),
    )
        .prop_map(|(key, seq, tags, attrs, note)| FuzzJob {
            key,
            seq,
            tags,
            attrs,
            note,
        })
}

/// One record value, built one of several ways.
#[derive(Clone, Debug)]
enum Input {
    /// Arbitrary bytes, sometimes with a valid-looking header.
    Raw(Vec<u8>),
    /// A valid record, then truncated, bit-flipped or spliced.
    Mutated(Vec<u8>),
    /// A valid header and a length prefix claiming up to 2^62 bytes.
    Hostile(Vec<u8>),
    /// A valid record (must decode).
    Valid(Vec<u8>),
}

impl Input {
    fn bytes(&self) -> &[u8] {
        match self {
            Input::Raw(b) | Input::Mutated(b) | Input::Hostile(b) | Input::Valid(b) => b,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Input::Raw(_) => "raw",
            Input::Mutated(_) => "mutated",
            Input::Hostile(_) => "hostile length",
            Input::Valid(_) => "valid",
        }
    }
}

fn input_strategy(v1: Arc<Schema>, v2: Arc<Schema>) -> impl Strategy<Value = Input> {
    let raw = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (0u32..4, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(id, b)| frame(id, &b)),
    ]
    .prop_map(Input::Raw);
    let (a, b) = (v1.clone(), v2.clone());
    let valid = (job_strategy(), any::<bool>()).prop_map(move |(job, newer)| {
        let body = if newer {
            encode(&b, &job, true)
        } else {
            encode(&a, &job, false)
        };
        Input::Valid(frame(if newer { 2 } else { 1 }, &body))
    });
    let (a, b) = (v1.clone(), v2.clone());
    let mutated = (
        job_strategy(),
        any::<bool>(),
        0usize..4,
        any::<prop::sample::Index>(),
        prop::collection::vec(any::<u8>(), 1..8),
    )
        .prop_map(move |(job, newer, how, at, noise)| {
            let body = if newer {
                encode(&b, &job, true)
            } else {
                encode(&a, &job, false)
            };
            let mut rec = frame(if newer { 2 } else { 1 }, &body);
            let i = at.index(rec.len().max(1));
            match how {
                0 => rec.truncate(i),
                1 => {
                    for (k, n) in noise.iter().enumerate() {
                        if let Some(byte) = rec.get_mut(i + k) {
                            *byte ^= n | 1;
                        }
                    }
                }
                2 => {
                    let at = i.min(rec.len());
                    rec.splice(at..at, noise);
                }
                _ => rec.extend_from_slice(&noise),
            }
            Input::Mutated(rec)
        });
    let hostile = (
        1u32..3,
        0usize..3,
        1i64..(1i64 << 62),
        prop::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(id, field, claim, tail)| {
            // key (a string), or after a valid key and seq: the tags array
            // count, or a string inside it.
            let mut body = Vec::new();
            match field {
                0 => body.extend(zigzag(claim)),
                1 => {
                    body.extend(zigzag(1));
                    body.push(b'k');
                    body.extend(zigzag(7));
                    body.extend(zigzag(claim));
                }
                _ => {
                    body.extend(zigzag(0));
                    body.extend(zigzag(7));
                    body.extend(zigzag(1));
                    body.extend(zigzag(claim));
                }
            }
            body.extend(tail);
            Input::Hostile(frame(id, &body))
        });
    prop_oneof![3 => raw, 3 => mutated, 2 => hostile, 1 => valid]
}

fn header_strategy() -> impl Strategy<Value = Vec<(String, Option<Vec<u8>>)>> {
    let names = prop::sample::select(vec![
        headers::JOB,
        headers::VERSION,
        headers::ID,
        headers::ATTEMPT,
        headers::DUE_AT,
        headers::FIRST_FAILED_AT,
        headers::ERROR_CLASS,
        headers::ERROR,
        headers::ORIGINAL_TOPIC,
        headers::ORIGINAL_PARTITION,
        headers::ORIGINAL_OFFSET,
        headers::ORIGINAL_TIMESTAMP,
        headers::GROUP,
        headers::TENANT,
        headers::TRACEPARENT,
        headers::TRACESTATE,
    ]);
    let key = prop_oneof![
        3 => names.prop_map(str::to_string),
        1 => "[a-z-]{0,10}",
    ];
    let value = prop::option::of(prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24),
        "-?[0-9]{1,20}".prop_map(String::into_bytes),
    ]);
    prop::collection::vec((key, value), 0..24)
}

fn main() -> std::process::ExitCode {
    let cases: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.replace('_', "").parse().ok())
        .unwrap_or(1_000_000);
    let bound = kjob::codec::bound_decode_allocations();
    if bound != MAX_DECODE_ALLOCATION {
        eprintln!("fuzz: the allocation bound is {bound}, not kjob's {MAX_DECODE_ALLOCATION}: something set it first");
        return std::process::ExitCode::FAILURE;
    }
    let (v1, v2) = match (Schema::parse_str(V1), Schema::parse_str(V2)) {
        (Ok(a), Ok(b)) => (Arc::new(a), Arc::new(b)),
        _ => {
            eprintln!("fuzz: the fuzz contract does not parse");
            return std::process::ExitCode::FAILURE;
        }
    };
    let reader = ReaderSchema::new((*v1).clone());
    let schemas = Schemas(HashMap::from([(1, v1.clone()), (2, v2.clone())]));
    let outcomes: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());
    let largest_seen = AtomicUsize::new(0);

    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    println!("fuzz: record decoder, {cases} cases (allocation bound {bound} bytes)");
    let t0 = Instant::now();
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(&input_strategy(v1.clone(), v2.clone()), |input| {
        LARGEST.store(0, Ordering::Relaxed);
        let decoded =
            futures::executor::block_on(reader.decode::<FuzzJob>(&schemas, Some(input.bytes())));
        let largest = LARGEST.load(Ordering::Relaxed);
        largest_seen.fetch_max(largest, Ordering::Relaxed);
        prop_assert!(
            largest <= MAP_TABLE_FACTOR * bound,
            "a {}-byte record made the decoder allocate {largest} bytes at once",
            input.bytes().len()
        );
        let outcome = match &decoded {
            Ok(_) => "decoded".to_string(),
            Err(e) => match e.class() {
                Some(class) => class.as_str().to_string(),
                None => return Err(TestCaseError::fail(format!("unclassified: {e}"))),
            },
        };
        if let Input::Valid(_) = input {
            prop_assert!(
                decoded.is_ok(),
                "a valid record failed: {:?}",
                decoded.err()
            );
        }
        *outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((input.kind().to_string(), outcome))
            .or_default() += 1;
        Ok(())
    });
    let decoder_time = t0.elapsed();
    if let Err(e) = result {
        eprintln!("fuzz: record decoder FAILED: {e}");
        return std::process::ExitCode::FAILURE;
    }
    println!(
        "fuzz: record decoder: {cases} cases in {decoder_time:.1?}, no panic, largest single allocation {} bytes",
        largest_seen.load(Ordering::Relaxed)
    );
    println!("  {:<16} {:<22} {:>9}", "input", "outcome", "cases");
    for ((kind, outcome), n) in outcomes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        println!("  {kind:<16} {outcome:<22} {n:>9}");
    }

    let t1 = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&header_strategy(), |set| {
        let mut owned = OwnedHeaders::new();
        for (k, v) in &set {
            owned = owned.insert(Header {
                key: k.as_str(),
                value: v.as_deref(),
            });
        }
        let parsed = JobHeaders::parse(Some(&owned));
        let _ = headers::find(Some(&owned), headers::DUE_AT);
        let rebuilt = parsed.to_owned_headers();
        let again = JobHeaders::parse(Some(&rebuilt));
        prop_assert_eq!(&again, &parsed, "a hop changed the headers");
        let mut keys: Vec<&str> = {
            use rdkafka::message::Headers as _;
            rebuilt.iter().map(|h| h.key).collect()
        };
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        prop_assert_eq!(keys.len(), n, "a rebuilt header set has a duplicate name");
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("fuzz: headers FAILED: {e}");
        return std::process::ExitCode::FAILURE;
    }
    println!(
        "fuzz: headers: {cases} cases in {:.1?}, no panic, every rebuilt set parses back equal with no duplicate names",
        t1.elapsed()
    );
    std::process::ExitCode::SUCCESS
}

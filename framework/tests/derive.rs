//! `#[derive(Job)]` against the trait's users: the generated schema is the
//! one apache-avro's own derive describes, it parses, and jobs round-trip
//! through kjob's codec with it; a file-backed contract is the file.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use apache_avro::{AvroSchema, Schema};
use kjob::codec::{decode_body, parse_contract, Codec, RegisteredContract};
use kjob::Job;
use serde::{Deserialize, Serialize};

/// Every field type the derive maps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema, Job)]
#[job(name = "kjob.derive.all", version = 3, key = id, tenant = tenant)]
struct AllTypes {
    /// The key.
    id: String,
    tenant: Option<String>,
    flag: bool,
    tiny: i8,
    small: i16,
    int: i32,
    byte: u8,
    short: u16,
    big: i64,
    unsigned: u32,
    single: f32,
    double: f64,
    letter: char,
    list: Vec<String>,
    maybe_list: Option<Vec<i64>>,
    map: HashMap<String, f64>,
    boxed: Box<str>,
    #[serde(rename = "renamed")]
    #[avro(rename = "renamed")]
    original: i64,
    #[serde(skip)]
    #[avro(skip)]
    cache: Vec<u8>,
}

fn all() -> AllTypes {
    AllTypes {
        id: "a-1".into(),
        tenant: Some("shop".into()),
        flag: true,
        tiny: -3,
        small: 300,
        int: -70_000,
        byte: 200,
        short: 60_000,
        big: 1 << 40,
        unsigned: 4_000_000_000,
        single: 1.5,
        double: -2.25,
        letter: 'k',
        list: vec!["x".into(), "y".into()],
        maybe_list: Some(vec![1, 2]),
        map: HashMap::from([("a".to_string(), 0.5)]),
        boxed: "b".into(),
        original: 9,
        cache: Vec::new(),
    }
}

fn round_trip<J: Job + Clone + PartialEq + std::fmt::Debug>(job: &J) -> J {
    let schema = Arc::new(parse_contract::<J>().unwrap_or_else(|e| panic!("{e}")));
    let contract = RegisteredContract {
        id: 7,
        subject: format!("{}-value", J::NAME),
        schema: schema.clone(),
    };
    let framed = Codec::encode(&contract, job).unwrap_or_else(|e| panic!("{e}"));
    decode_body::<J>(7, &schema, &framed[5..], &schema).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_generated_schema_is_apache_avros_for_the_same_type() {
    let generated = parse_contract::<AllTypes>().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        generated.canonical_form(),
        AllTypes::get_schema().canonical_form(),
        "{}",
        AllTypes::SCHEMA
    );
}

#[test]
fn every_mapped_type_round_trips_through_the_codec() {
    let job = all();
    assert_eq!(round_trip(&job), job);
    let none = AllTypes {
        tenant: None,
        maybe_list: None,
        ..all()
    };
    assert_eq!(round_trip(&none), none);
}

#[test]
fn name_version_key_and_tenant_come_from_the_attribute() {
    assert_eq!(AllTypes::NAME, "kjob.derive.all");
    assert_eq!(AllTypes::VERSION, 3);
    let job = all();
    assert_eq!(job.key(), "a-1");
    assert_eq!(job.tenant().as_deref(), Some("shop"));
    assert_eq!(
        AllTypes {
            tenant: None,
            ..all()
        }
        .tenant(),
        None
    );
}

/// BTreeMap is a map on the wire like HashMap (apache-avro's derive has
/// no impl for it, so it is tested apart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
#[job(name = "kjob.derive.sorted", version = 1, key = id)]
struct Sorted {
    id: String,
    sorted: BTreeMap<String, Option<i32>>,
}

#[test]
fn a_btree_map_is_an_avro_map() {
    let job = Sorted {
        id: "x".into(),
        sorted: BTreeMap::from([("n".to_string(), None), ("s".to_string(), Some(7))]),
    };
    assert_eq!(round_trip(&job), job);
    assert!(Sorted::SCHEMA.contains(r#"{"type": "map", "values": ["null", "int"]}"#));
}

/// A key that is not a String, a plain String tenant, a namespace, a
/// default for a field added later.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
#[job(name = "kjob.derive.numbered", version = 1, key = invoice_no, tenant = shop, namespace = "kjob.derive")]
struct Numbered {
    invoice_no: i64,
    shop: String,
    #[job(default = "EUR")]
    currency: String,
    #[job(default = -1)]
    retries: i32,
}

#[test]
fn defaults_and_namespace_are_in_the_schema_and_keys_are_display_text() {
    let job = Numbered {
        invoice_no: 42,
        shop: "s".into(),
        currency: "CHF".into(),
        retries: 0,
    };
    assert_eq!(job.key(), "42");
    assert_eq!(job.tenant().as_deref(), Some("s"));
    assert_eq!(round_trip(&job), job);
    let schema: serde_json::Value =
        serde_json::from_str(Numbered::SCHEMA).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(schema["namespace"], "kjob.derive");
    assert_eq!(schema["fields"][2]["default"], "EUR");
    assert_eq!(schema["fields"][3]["default"], -1);

    // A record written before `currency` and `retries` existed reads as
    // their defaults.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
    #[job(name = "kjob.derive.numbered", version = 1, key = invoice_no, namespace = "kjob.derive")]
    struct NumberedV0 {
        invoice_no: i64,
        shop: String,
    }
    let old = Arc::new(parse_contract::<NumberedV0>().unwrap_or_else(|e| panic!("{e}")));
    let new = Schema::parse_str(Numbered::SCHEMA).unwrap_or_else(|e| panic!("{e}"));
    let contract = RegisteredContract {
        id: 1,
        subject: "s".into(),
        schema: old.clone(),
    };
    let framed = Codec::encode(
        &contract,
        &NumberedV0 {
            invoice_no: 1,
            shop: "s".into(),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let read: Numbered = decode_body(1, &old, &framed[5..], &new).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read.currency, "EUR");
    assert_eq!(read.retries, -1);
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Address {
    city: String,
    zip: String,
}

/// A nested record: the schema comes from the file, checked by field name
/// for `address` and by type for the rest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
#[job(
    name = "kjob.derive.nested",
    version = 2,
    key = shipment_id,
    schema = "tests/schemas/kjob.derive.nested.v2.avsc"
)]
struct Shipment {
    shipment_id: String,
    address: Address,
    carrier: String,
    weight_grams: Option<i64>,
}

#[test]
fn a_file_backed_contract_is_the_file() {
    assert_eq!(
        Shipment::SCHEMA,
        include_str!("schemas/kjob.derive.nested.v2.avsc")
    );
    let job = Shipment {
        shipment_id: "s-1".into(),
        address: Address {
            city: "Bern".into(),
            zip: "3000".into(),
        },
        carrier: "post".into(),
        weight_grams: Some(1200),
    };
    assert_eq!(round_trip(&job), job);
}

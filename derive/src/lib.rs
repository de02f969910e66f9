//! `#[derive(Job)]` for [kjob](https://docs.rs/kjob): a job contract from
//! a struct. Use it through the `kjob` crate (`use kjob::Job;` brings the
//! trait and the derive); the settings, the Avro mapping and why the schema
//! is written at compile time are documented on [`derive@Job`].

#![warn(unreachable_pub, missing_docs)]

mod attrs;
mod avro;
mod json;

use std::path::{Path, PathBuf};

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, Ident, Type};

use attrs::{Container, Errors, SerdeContainer, SerdeField};
use avro::Avro;
use json::Json;

/// `#[derive(Job)]`: a kjob job contract from a struct.
///
/// Use it through the `kjob` crate, which re-exports it next to the trait
/// (`use kjob::Job;` brings both, as `use serde::Serialize;` does):
///
/// ```ignore
/// use kjob::Job;
/// use serde::{Deserialize, Serialize};
///
/// /// Mail the order confirmation.
/// #[derive(Serialize, Deserialize, Job)]
/// #[job(name = "orders.confirmation", version = 1, key = order_id, tenant = tenant)]
/// struct SendOrderConfirmation {
///     order_id: String,
///     tenant: String,
///     /// Added in version 1 of the app, after the first deploy.
///     #[job(default = "en")]
///     locale: String,
/// }
/// ```
///
/// # Settings
///
/// | `#[job(...)]` | what | required |
/// |---|---|---|
/// | `name = "..."` | `Job::NAME`: the contract name and default main topic (Kafka topic characters only) | yes |
/// | `version = N` | `Job::VERSION`, 1 or more | yes |
/// | `key = field` | `Job::key`: the field's `Display` text | yes |
/// | `tenant = field` | `Job::tenant`: a `String` (always `Some`) or an `Option<String>` field | no |
/// | `schema = "path"` | take `Job::SCHEMA` from this `.avsc` file (relative to the crate's `Cargo.toml`) instead of generating it | no |
/// | `namespace = "..."` | the generated record's Avro namespace | no |
///
/// On a field, `#[job(default = <literal>)]` gives the generated schema a
/// default for it: what a reader of this version fills in for records
/// written before the field existed (`Option` fields default to `null`
/// without it).
///
/// **Why `key` is required.** Every job record carries a key: the producer
/// partitions by it and the worker's default ordering runs one key's jobs
/// one after another. A contract without one would either land every job
/// on one partition or quietly lose the ordering its handlers rely on, so
/// the derive asks for the field rather than guessing.
///
/// # Where the schema comes from
///
/// `Job::SCHEMA` is a `&'static str` constant, and the worker and producer
/// read it as such (the registry is sent that exact text, and
/// `kjob schema export` writes it to `schemas/`). apache-avro's
/// `AvroSchema` derive builds its schema at run time, so it cannot fill a
/// constant; changing the trait to a run-time method would have changed
/// every hand-written `impl Job` and the code that reads `SCHEMA` while
/// giving nothing a constant cannot. So the derive **writes the schema
/// JSON at compile time** from the field types, with the mapping
/// apache-avro's serde writer and its `AvroSchema` derive use:
///
/// | Rust | Avro |
/// |---|---|
/// | `bool` | `boolean` |
/// | `i8`, `i16`, `i32`, `u8`, `u16` | `int` |
/// | `i64`, `u32` | `long` |
/// | `f32` / `f64` | `float` / `double` |
/// | `String`, `char` | `string` |
/// | `Option<T>` | `["null", T]`, default `null` |
/// | `Vec<T>` | `{"type": "array", "items": T}` |
/// | `HashMap<String, T>`, `BTreeMap<String, T>` | `{"type": "map", "values": T}` |
/// | `Box<T>` | `T` |
///
/// The record's name is the struct's, its `doc` the struct's `///`
/// comment, each field's `doc` the field's. `#[serde(rename = "...")]`
/// and `#[serde(skip)]` on fields are followed.
///
/// A macro sees tokens, not types: for a field of another struct or enum
/// of yours (`address: Address`), or of `u64` (Avro has no unsigned
/// 64-bit integer), it cannot write the schema, and says so at compile
/// time. Give such a contract its schema as a file.
///
/// # A schema file, checked at compile time
///
/// With `schema = "schemas/orders.confirmation.v1.avsc"` the constant is
/// that file (through `include_str!`, so editing the file rebuilds the
/// crate), and the derive reads it while expanding and compares it with
/// the struct: a field missing on either side, or declared with another
/// type than the Rust field has on the wire (`i32` against `"long"`, a
/// non-`Option` against a union with `null`), is a compile error naming
/// the field. Fields of types the derive cannot see into are compared by
/// name. A file named like a contract (`<name>.v<N>.avsc`) must be the one
/// of this name and version.
///
/// Files are the way to keep an old version next to a new one (the
/// `schema_evolution` example), to state defaults and aliases by hand, and
/// for nested records. Generated schemas are best exported to `schemas/`
/// with `kjob schema export` so a pull request shows the contract change.
///
/// # Not supported
///
/// Enums, tuple structs and generic structs are not job contracts (a
/// contract is one Avro record). `#[serde(rename_all)]`, `transparent`,
/// `from`/`into`, `flatten` and the `skip_serializing*` settings change
/// what is on the wire in ways the derive does not model; they are compile
/// errors. Write `impl Job` by hand for those: the trait is unchanged.
#[proc_macro_derive(Job, attributes(job))]
pub fn derive_job(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// One field as the schema sees it.
struct Field<'a> {
    ident: &'a Ident,
    ty: &'a Type,
    /// The name on the wire (`#[serde(rename)]` or the field's own).
    wire: String,
    avro: Avro,
    doc: Option<String>,
    default: Option<(Json, Span)>,
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let ty = &input.ident;
    let named = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => named,
            _ => {
                return Err(syn::Error::new(
                    ty.span(),
                    "`#[derive(Job)]` needs named fields: a job contract is an Avro record, one field per struct field",
                ))
            }
        },
        _ => {
            return Err(syn::Error::new(
                ty.span(),
                "`#[derive(Job)]` is for structs: a job contract is an Avro record (write `impl Job` by hand to wrap an enum)",
            ))
        }
    };
    let mut errors = Errors::default();
    if !input.generics.params.is_empty() {
        errors.at(
            input.generics.span(),
            "a job contract has no type or lifetime parameters: its name, version and schema are fixed",
        );
    }
    let c = Container::parse(&input.attrs, &mut errors);
    // What a missing setting is reported on: the `#[job]` attribute, or
    // the struct's name when there is none.
    let attr_tokens = match &c.attr {
        Some(a) => a.to_token_stream(),
        None => ty.to_token_stream(),
    };
    for (name, span) in SerdeContainer::parse(&input.attrs, &mut errors).reshaping {
        errors.at(
            span,
            format!(
                "`#[serde({name})]` changes the record's fields in a way `#[derive(Job)]` does not follow; \
                 rename fields one by one with `#[serde(rename = \"...\")]`, or write `impl Job` by hand"
            ),
        );
    }

    let name = contract_name(&c, &attr_tokens, &mut errors);
    let version = contract_version(&c, &attr_tokens, &mut errors);

    let fields = record_fields(named, &mut errors);

    let (key, tenant) = key_and_tenant(&c, named, ty, &attr_tokens, &mut errors);

    let schema = match &c.schema {
        Some(path) => {
            if let Some(ns) = &c.namespace {
                errors.at(
                    ns.span(),
                    "with `schema = \"...\"` the namespace is the file's",
                );
            }
            for f in &fields {
                if let Some((_, span)) = &f.default {
                    errors.at(
                        *span,
                        "with `schema = \"...\"` defaults are the file's: declare it there",
                    );
                }
            }
            from_file(path, ty, &fields, name.as_deref(), version, &mut errors)
        }
        None => {
            let text = generate(input, &c, &fields, &mut errors);
            Some(quote!(#text))
        }
    };

    errors.finish()?;
    let (Some(name), Some(version), Some(key), Some(schema)) = (name, version, key, schema) else {
        // Every `None` above pushed an error, so this is not reached.
        return Err(syn::Error::new_spanned(
            attr_tokens,
            "incomplete `#[job(...)]`",
        ));
    };
    let key_body = quote_spanned! {key.span()=>
        ::std::string::ToString::to_string(&self.#key)
    };
    let tenant_fn = tenant.map(|(t, optional)| {
        let body = if optional {
            quote_spanned! {t.span()=>
                ::std::option::Option::map(
                    ::std::option::Option::as_ref(&self.#t),
                    ::std::string::ToString::to_string,
                )
            }
        } else {
            quote_spanned! {t.span()=>
                ::std::option::Option::Some(::std::string::ToString::to_string(&self.#t))
            }
        };
        quote! {
            fn tenant(&self) -> ::std::option::Option<::std::string::String> {
                #body
            }
        }
    });
    Ok(quote! {
        #[automatically_derived]
        impl ::kjob::Job for #ty {
            const NAME: &'static str = #name;
            const VERSION: u32 = #version;
            const SCHEMA: &'static str = #schema;
            fn key(&self) -> ::std::string::String {
                #key_body
            }
            #tenant_fn
        }
    })
}

/// The contract name from `#[job(name = ...)]`, checked as a topic name.
fn contract_name(c: &Container, attr_tokens: &TokenStream, errors: &mut Errors) -> Option<String> {
    match &c.name {
        Some(lit) => {
            let v = lit.value();
            if let Err(why) = check_topic_name(&v) {
                errors.at(
                    lit.span(),
                    format!("`{v}` cannot be a contract name: {why}"),
                );
            }
            Some(v)
        }
        None => {
            errors.spanned(
                attr_tokens,
                "missing `name = \"...\"` in `#[job(...)]`: the contract name, which is also the main topic, e.g. `#[job(name = \"orders.confirmation\", version = 1, key = order_id)]`",
            );
            None
        }
    }
}

/// The contract version from `#[job(version = ...)]`, 1 or more.
fn contract_version(c: &Container, attr_tokens: &TokenStream, errors: &mut Errors) -> Option<u32> {
    match &c.version {
        Some(lit) => match lit.base10_parse::<u32>() {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                errors.at(lit.span(), "`version` is a whole number from 1 up");
                None
            }
        },
        None => {
            errors.spanned(
                attr_tokens,
                "missing `version = N` in `#[job(...)]`: the contract version, 1 for a new contract",
            );
            None
        }
    }
}

/// The record's fields, as the struct's named fields with their serde
/// renames (skipped fields left out), each with its Avro type.
fn record_fields<'a>(named: &'a syn::FieldsNamed, errors: &mut Errors) -> Vec<Field<'a>> {
    let mut fields = Vec::new();
    for f in &named.named {
        let Some(ident) = &f.ident else { continue };
        let serde = SerdeField::parse(&f.attrs, errors);
        let default = attrs::field_default(&f.attrs, errors);
        if let Some((what, span)) = &serde.unsupported {
            errors.at(
                *span,
                format!(
                    "`#[serde({what})]` makes field `{ident}` differ between writing and reading, which an Avro record cannot; \
                     `#[derive(Job)]` does not support it (write `impl Job` by hand)"
                ),
            );
        }
        if serde.skip {
            if let Some((_, span)) = default {
                errors.at(
                    span,
                    "a skipped field is not in the schema, so it has no default",
                );
            }
            continue;
        }
        let wire = serde
            .rename
            .clone()
            .unwrap_or_else(|| ident.unraw().to_string());
        if !is_avro_name(&wire) {
            errors.at(
                ident.span(),
                format!("`{wire}` is not an Avro field name (letters, digits and `_`, not starting with a digit)"),
            );
        }
        let avro = match &serde.custom {
            Some((what, _)) => Avro::Opaque(format!(
                "`#[serde({what})]` puts something other than `{}` on the wire",
                type_name(&f.ty)
            )),
            None => Avro::of(&f.ty),
        };
        fields.push(Field {
            ident,
            ty: &f.ty,
            wire,
            avro,
            doc: attrs::doc(&f.attrs),
            default,
        });
    }
    fields
}

/// The `key` field (required, not an `Option`) and the `tenant` field (with
/// whether it is an `Option`), each a field of the struct.
#[allow(clippy::type_complexity)]
fn key_and_tenant<'c>(
    c: &'c Container,
    named: &syn::FieldsNamed,
    ty: &Ident,
    attr_tokens: &TokenStream,
    errors: &mut Errors,
) -> (Option<&'c Ident>, Option<(&'c Ident, bool)>) {
    let field_of = |id: &Ident| named.named.iter().find(|f| f.ident.as_ref() == Some(id));
    let key = match &c.key {
        Some(k) => {
            match field_of(k) {
                Some(f) if is_option(&f.ty) => {
                    errors.at(
                    k.span(),
                    format!("`key = {k}`: the field is an `Option`, but every job record needs a key"),
                );
                    None
                }
                Some(_) => Some(k),
                None => {
                    errors.at(k.span(), format!("`key = {k}`: `{ty}` has no field `{k}`"));
                    None
                }
            }
        }
        None => {
            errors.spanned(
                attr_tokens,
                "missing `key = <field>` in `#[job(...)]`: every job record gets a partition key, and jobs with the same key run in order; \
                 name the field of the entity the job is about, e.g. `key = order_id`",
            );
            None
        }
    };
    let tenant = match &c.tenant {
        Some(t) => match field_of(t) {
            Some(f) => Some((t, is_option(&f.ty))),
            None => {
                errors.at(
                    t.span(),
                    format!("`tenant = {t}`: `{ty}` has no field `{t}`"),
                );
                None
            }
        },
        None => None,
    };
    (key, tenant)
}

/// The schema JSON from the fields, laid out like a hand-written `.avsc`.
fn generate(
    input: &DeriveInput,
    c: &Container,
    fields: &[Field<'_>],
    errors: &mut Errors,
) -> String {
    let record = input.ident.unraw().to_string();
    let mut lines = vec![
        format!("  \"type\": {}", Json::str("record").compact()),
        format!("  \"name\": {}", Json::str(record).compact()),
    ];
    if let Some(ns) = &c.namespace {
        let v = ns.value();
        if !v.split('.').all(is_avro_name) {
            errors.at(
                ns.span(),
                format!("`{v}` is not an Avro namespace (names joined by `.`)"),
            );
        }
        lines.push(format!("  \"namespace\": {}", Json::str(v).compact()));
    }
    if let Some(doc) = attrs::doc(&input.attrs) {
        lines.push(format!("  \"doc\": {}", Json::str(doc).compact()));
    }
    let mut rendered = Vec::new();
    for f in fields {
        if let Some(why) = f.avro.opaque() {
            errors.at(
                f.ty.span(),
                format!(
                    "field `{}`: {why}. Give this contract its schema as a file: `#[job(schema = \"schemas/<name>.v<N>.avsc\")]`",
                    f.ident
                ),
            );
            continue;
        }
        let mut pairs = vec![
            ("name".to_string(), Json::str(f.wire.clone())),
            ("type".to_string(), f.avro.to_json()),
        ];
        match (&f.avro, &f.default) {
            (Avro::Optional(_), Some((_, span))) => errors.at(
                *span,
                "an `Option` field's default is `null`, always: Avro takes a union's default from its first branch",
            ),
            (Avro::Optional(_), None) => pairs.push(("default".into(), Json::Null)),
            (avro, Some((value, span))) => {
                if default_fits(avro, value) {
                    pairs.push(("default".into(), value.clone()));
                } else {
                    errors.at(
                        *span,
                        format!(
                            "this default does not fit field `{}` of Avro type {}",
                            f.ident,
                            avro.describe()
                        ),
                    );
                }
            }
            (_, None) => {}
        }
        if let Some(doc) = &f.doc {
            pairs.push(("doc".into(), Json::str(doc.clone())));
        }
        rendered.push(format!("    {}", Json::Obj(pairs).compact()));
    }
    if rendered.is_empty() {
        lines.push("  \"fields\": []".into());
    } else {
        lines.push(format!("  \"fields\": [\n{}\n  ]", rendered.join(",\n")));
    }
    format!("{{\n{}\n}}\n", lines.join(",\n"))
}

/// Whether a literal default suits a field's Avro type.
fn default_fits(avro: &Avro, value: &Json) -> bool {
    match (avro, value) {
        (Avro::Prim("string"), Json::Str(_)) | (Avro::Prim("boolean"), Json::Bool(_)) => true,
        (Avro::Prim("int"), Json::Num(n)) => n.parse::<i32>().is_ok(),
        (Avro::Prim("long"), Json::Num(n)) => n.parse::<i64>().is_ok(),
        (Avro::Prim("float" | "double"), Json::Num(_)) => true,
        _ => false,
    }
}

/// `include_str!` of the schema file, after comparing it with the fields.
fn from_file(
    lit: &syn::LitStr,
    ty: &Ident,
    fields: &[Field<'_>],
    name: Option<&str>,
    version: Option<u32>,
    errors: &mut Errors,
) -> Option<TokenStream> {
    let rel = lit.value();
    let span = lit.span();
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        errors.at(
            span,
            "CARGO_MANIFEST_DIR is not set (build with cargo): `schema` paths are relative to it",
        );
        return None;
    };
    let path = PathBuf::from(dir).join(&rel);
    if let (Some(name), Some(version)) = (name, version) {
        if let Some((file_name, file_version)) = contract_file_name(&path) {
            if file_name != name || file_version != version {
                errors.at(
                    span,
                    format!(
                        "`{rel}` is named for contract `{file_name}` v{file_version}, but this is `{name}` v{version}: \
                         `kjob schema check` and `kjob schema export` pair files and contracts by that name"
                    ),
                );
            }
        }
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            errors.at(
                span,
                format!("cannot read `{rel}` ({}): {e}", path.display()),
            );
            return None;
        }
    };
    let Some(abs) = path.to_str() else {
        errors.at(span, format!("the path of `{rel}` is not UTF-8"));
        return None;
    };
    let declared = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) => v,
        Err(e) => {
            errors.at(span, format!("`{rel}` is not JSON: {e}"));
            return None;
        }
    };
    let file_fields = match (
        declared.get("type").and_then(|t| t.as_str()),
        declared.get("fields").and_then(|f| f.as_array()),
    ) {
        (Some("record"), Some(fields)) => fields,
        _ => {
            errors.at(
                span,
                format!(
                    "`{rel}` is not an Avro record schema (`\"type\": \"record\"` with `fields`)"
                ),
            );
            return None;
        }
    };
    let mut seen = Vec::new();
    for ff in file_fields {
        let Some(fname) = ff.get("name").and_then(|n| n.as_str()) else {
            errors.at(span, format!("`{rel}` has a field without a name"));
            continue;
        };
        seen.push(fname);
        let Some(ftype) = ff.get("type") else {
            errors.at(span, format!("`{rel}`: field `{fname}` has no type"));
            continue;
        };
        match fields.iter().find(|f| f.wire == fname) {
            None => errors.at(
                span,
                format!("`{rel}` declares field `{fname}`, which `{ty}` does not have"),
            ),
            Some(f) if !f.avro.matches(ftype) => errors.at(
                f.ty.span(),
                format!(
                    "field `{fname}`: `{}` is Avro {} on the wire, but `{rel}` declares {ftype}",
                    type_name(f.ty),
                    f.avro.describe()
                ),
            ),
            Some(_) => {}
        }
    }
    for f in fields.iter().filter(|f| !seen.contains(&f.wire.as_str())) {
        errors.at(
            f.ident.span(),
            format!("field `{}` of `{ty}` is not in `{rel}`", f.wire),
        );
    }
    Some(quote!(::core::include_str!(#abs)))
}

/// `("orders.confirmation", 1)` for `.../orders.confirmation.v1.avsc`.
fn contract_file_name(path: &Path) -> Option<(String, u32)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".avsc")?;
    let (name, version) = stem.rsplit_once(".v")?;
    Some((name.to_string(), version.parse().ok()?))
}

/// Kafka's rule for topic names (the contract name is the main topic).
fn check_topic_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name == "." || name == ".." {
        return Err("a topic name is not empty, `.` or `..`");
    }
    if name.len() > 200 {
        return Err("topic names are limited to 249 characters, and kjob appends up to ~40 for retry, delay and DLQ topics");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err("topic names use ASCII letters, digits, `.`, `_` and `-` only");
    }
    Ok(())
}

/// Avro's rule for names: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_avro_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_option(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}

/// `Option<String>` rather than `Option < String >`.
fn type_name(ty: &Type) -> String {
    ty.to_token_stream()
        .to_string()
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace(" ,", ",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(src: &str) -> Result<String, String> {
        let input: DeriveInput = syn::parse_str(src).map_err(|e| e.to_string())?;
        expand(&input)
            .map(|t| t.to_string())
            .map_err(|e| e.into_compile_error().to_string())
    }

    #[test]
    fn a_generated_schema_reads_like_a_hand_written_one() {
        let out = expand_str(
            r#"
            /// Mail the order confirmation.
            #[job(name = "orders.confirmation", version = 1, key = order_id, tenant = tenant, namespace = "kjob.orders")]
            struct SendOrderConfirmation {
                order_id: String,
                tenant: Option<String>,
                /// Mail language.
                #[job(default = "en")]
                locale: String,
                #[serde(rename = "tries")]
                attempts: i32,
                #[serde(skip)]
                cache: Vec<u8>,
            }"#,
        );
        let out = out.unwrap_or_else(|e| e);
        let expected = "{\n  \"type\": \"record\",\n  \"name\": \"SendOrderConfirmation\",\n  \"namespace\": \"kjob.orders\",\n  \"doc\": \"Mail the order confirmation.\",\n  \"fields\": [\n    {\"name\": \"order_id\", \"type\": \"string\"},\n    {\"name\": \"tenant\", \"type\": [\"null\", \"string\"], \"default\": null},\n    {\"name\": \"locale\", \"type\": \"string\", \"default\": \"en\", \"doc\": \"Mail language.\"},\n    {\"name\": \"tries\", \"type\": \"int\"}\n  ]\n}\n";
        let lit = proc_macro2::Literal::string(expected).to_string();
        assert!(out.contains(&lit), "{out}");
        assert!(
            out.contains("const NAME : & 'static str = \"orders.confirmation\""),
            "{out}"
        );
        assert!(out.contains("fn tenant"), "{out}");
    }

    #[test]
    fn missing_settings_are_reported_together() {
        let err = expand_str("#[job(version = 0)] struct J { a: u64 }")
            .err()
            .unwrap_or_default();
        assert!(err.contains("missing `name"), "{err}");
        assert!(err.contains("from 1 up"), "{err}");
        assert!(err.contains("missing `key"), "{err}");
        assert!(err.contains("unsigned"), "{err}");
    }

    #[test]
    fn contract_file_names_pair_name_and_version() {
        assert_eq!(
            contract_file_name(Path::new("schemas/orders.confirmation.v12.avsc")),
            Some(("orders.confirmation".into(), 12))
        );
        assert_eq!(contract_file_name(Path::new("schemas/order.avsc")), None);
        assert!(check_topic_name("orders.confirmation").is_ok());
        assert!(check_topic_name("orders confirmation").is_err());
    }
}

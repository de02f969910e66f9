//! `#[job(...)]` and the `#[serde(...)]` attributes that change what a
//! struct looks like on the wire.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, LitInt, LitStr, Token};

use crate::json::Json;

/// `#[job(...)]` on the struct.
#[derive(Default)]
pub(crate) struct Container {
    pub name: Option<LitStr>,
    pub version: Option<LitInt>,
    pub key: Option<Ident>,
    pub tenant: Option<Ident>,
    pub schema: Option<LitStr>,
    pub namespace: Option<LitStr>,
    /// The first `#[job]` attribute, for errors about what is missing.
    pub attr: Option<Attribute>,
}

const CONTAINER_KEYS: &str = "name, version, key, tenant, schema, namespace";

impl Container {
    pub(crate) fn parse(attrs: &[Attribute], errors: &mut Errors) -> Container {
        let mut c = Container::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("job")) {
            c.attr.get_or_insert_with(|| attr.clone());
            let result = attr.parse_nested_meta(|meta| {
                let key = meta
                    .path
                    .get_ident()
                    .map(Ident::to_string)
                    .unwrap_or_default();
                match key.as_str() {
                    "name" => set(&mut c.name, &meta, meta.value()?.parse()?),
                    "version" => set(&mut c.version, &meta, meta.value()?.parse()?),
                    "key" => set(&mut c.key, &meta, meta.value()?.parse()?),
                    "tenant" => set(&mut c.tenant, &meta, meta.value()?.parse()?),
                    "schema" => set(&mut c.schema, &meta, meta.value()?.parse()?),
                    "namespace" => set(&mut c.namespace, &meta, meta.value()?.parse()?),
                    _ => Err(meta.error(format!(
                        "unknown `#[job]` setting; the settings are: {CONTAINER_KEYS}"
                    ))),
                }
            });
            if let Err(e) = result {
                errors.push(e);
            }
        }
        c
    }
}

/// Stores a setting, refusing a second one.
fn set<T>(slot: &mut Option<T>, meta: &ParseNestedMeta<'_>, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error("set twice"));
    }
    *slot = Some(value);
    Ok(())
}

/// `#[job(default = ...)]` on a field: the Avro default, for a field added
/// to a contract that older records lack.
pub(crate) fn field_default(attrs: &[Attribute], errors: &mut Errors) -> Option<(Json, Span)> {
    let mut out = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("job")) {
        let result = attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("default") {
                return Err(meta.error(
                    "unknown `#[job]` setting on a field; the only one is `default = <literal>`",
                ));
            }
            let value = meta.value()?;
            let negative = value.peek(Token![-]);
            if negative {
                value.parse::<Token![-]>()?;
            }
            let lit: syn::Lit = value.parse()?;
            let span = lit.span();
            let json = match (&lit, negative) {
                (syn::Lit::Str(s), false) => Json::Str(s.value()),
                (syn::Lit::Bool(b), false) => Json::Bool(b.value),
                (syn::Lit::Int(i), _) => {
                    let n: i64 = i.base10_parse()?;
                    Json::Num(if negative {
                        format!("-{n}")
                    } else {
                        n.to_string()
                    })
                }
                (syn::Lit::Float(f), _) => {
                    let n: f64 = f.base10_parse()?;
                    Json::Num(format!("{}{n:?}", if negative { "-" } else { "" }))
                }
                _ => {
                    return Err(syn::Error::new(
                        span,
                        "a default is a string, integer, float or bool literal",
                    ))
                }
            };
            if out.replace((json, span)).is_some() {
                return Err(meta.error("set twice"));
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    out
}

/// What `#[serde(...)]` does to a struct's wire form.
#[derive(Default)]
pub(crate) struct SerdeContainer {
    /// Attributes that change field names or the shape (`rename_all`,
    /// `transparent`, `from`, ...), which the derive does not model.
    pub reshaping: Vec<(String, Span)>,
}

/// Container attributes that leave the field list as it is.
const NEUTRAL_CONTAINER: [&str; 6] = [
    "deny_unknown_fields",
    "default",
    "bound",
    "crate",
    "expecting",
    "rename",
];

impl SerdeContainer {
    pub(crate) fn parse(attrs: &[Attribute], errors: &mut Errors) -> SerdeContainer {
        let mut out = SerdeContainer::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            let result = attr.parse_nested_meta(|meta| {
                let name = path_name(&meta);
                if !NEUTRAL_CONTAINER.contains(&name.as_str()) {
                    out.reshaping.push((name, meta.path.span()));
                }
                skip_value(&meta)
            });
            if let Err(e) = result {
                errors.push(e);
            }
        }
        out
    }
}

/// What `#[serde(...)]` does to one field.
#[derive(Default)]
pub(crate) struct SerdeField {
    /// `rename = "..."`: the name on the wire.
    pub rename: Option<String>,
    /// `skip`: not on the wire at all.
    pub skip: bool,
    /// `with`, `serialize_with`, `deserialize_with`: some other type is on
    /// the wire.
    pub custom: Option<(String, Span)>,
    /// Attributes that make the field's presence differ between writing
    /// and reading (`skip_serializing_if`, `flatten`, ...).
    pub unsupported: Option<(String, Span)>,
}

const NEUTRAL_FIELD: [&str; 4] = ["default", "alias", "borrow", "bound"];

impl SerdeField {
    pub(crate) fn parse(attrs: &[Attribute], errors: &mut Errors) -> SerdeField {
        let mut out = SerdeField::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            let result = attr.parse_nested_meta(|meta| {
                let name = path_name(&meta);
                match name.as_str() {
                    "rename" if meta.input.peek(Token![=]) => {
                        let lit: LitStr = meta.value()?.parse()?;
                        out.rename = Some(lit.value());
                        return Ok(());
                    }
                    "skip" => out.skip = true,
                    "with" | "serialize_with" | "deserialize_with" => {
                        out.custom = Some((name, meta.path.span()))
                    }
                    n if NEUTRAL_FIELD.contains(&n) => {}
                    _ => out.unsupported = Some((name, meta.path.span())),
                }
                skip_value(&meta)
            });
            if let Err(e) = result {
                errors.push(e);
            }
        }
        out
    }
}

fn path_name(meta: &ParseNestedMeta<'_>) -> String {
    meta.path
        .get_ident()
        .map(Ident::to_string)
        .unwrap_or_else(|| "?".into())
}

/// Consumes `= value` or `(...)` after a serde setting the derive ignores.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        let _: syn::Lit = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::Group = meta.input.parse()?;
    }
    Ok(())
}

/// The text of `///` comments (`#[doc = "..."]`), lines joined by spaces:
/// what goes into the schema's `doc`.
pub(crate) fn doc(attrs: &[Attribute]) -> Option<String> {
    let mut lines = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let syn::Meta::NameValue(nv) = &attr.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                let line = s.value();
                let line = line.trim();
                if !line.is_empty() {
                    lines.push(line.to_string());
                }
            }
        }
    }
    (!lines.is_empty()).then(|| lines.join(" "))
}

/// Collected errors, reported together so one build shows them all.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// An error covering all of `tokens` (a whole attribute), where a
    /// [`Span`] alone would mark its first token only.
    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

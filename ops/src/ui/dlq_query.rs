//! The DLQ page's query string: filters, search, audit states, sort and
//! page, parsed leniently (a bad value is its default, not an error page),
//! and the links that change one of them.

use maud::{html, Markup};
use serde::Deserialize;

use crate::dlq::index::{Query, Sort, StatusFilter};
use crate::dlq::{empty_as_none, Select};

/// The DLQ browser's query: the filters, the search, the audit states,
/// the sort and the page (all strings, parsed here: a bad value falls back
/// to its default rather than failing the page).
#[derive(Deserialize, Default, Clone)]
pub(super) struct DlqQuery {
    /// The DLQ and the filters, as `kjob dlq list` takes them.
    #[serde(flatten)]
    pub(super) select: Select,
    #[serde(default)]
    pub(super) all: Option<String>,
    /// Search in key, job id, error and payload text.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub(super) q: Option<String>,
    #[serde(default, deserialize_with = "empty_as_none")]
    sort: Option<String>,
    /// `asc` or `desc`.
    #[serde(default, deserialize_with = "empty_as_none")]
    dir: Option<String>,
    /// 1-based.
    #[serde(default, deserialize_with = "empty_as_none")]
    page: Option<String>,
    /// Rows per page.
    #[serde(default, deserialize_with = "empty_as_none")]
    per: Option<String>,
}

/// Rows per page unless `per=` says otherwise, and the most it may say.
const PER_PAGE: usize = 50;
const MAX_PER_PAGE: usize = 500;

impl DlqQuery {
    pub(super) fn sort(&self) -> Sort {
        self.sort
            .as_deref()
            .and_then(Sort::parse)
            .unwrap_or_default()
    }
    /// Descending unless `dir=asc`; a sort by text defaults to ascending.
    pub(super) fn desc(&self) -> bool {
        match self.dir.as_deref() {
            Some("asc") => false,
            Some("desc") => true,
            _ => matches!(self.sort(), Sort::Time | Sort::Attempts),
        }
    }
    fn per(&self) -> usize {
        self.per
            .as_deref()
            .and_then(|p| p.parse().ok())
            .filter(|p| *p >= 1)
            .map_or(PER_PAGE, |p: usize| p.min(MAX_PER_PAGE))
    }
    pub(super) fn page(&self) -> usize {
        self.page
            .as_deref()
            .and_then(|p| p.parse().ok())
            .filter(|p| *p >= 1)
            .unwrap_or(1)
    }
    /// The index query these parameters mean.
    pub(super) fn index_query(&self) -> anyhow::Result<Query> {
        let per = self.per();
        Ok(Query {
            filter: self.select.filter()?,
            search: self.q.clone(),
            status: if self.all.is_some() {
                StatusFilter::All
            } else {
                StatusFilter::Unresolved
            },
            sort: self.sort(),
            desc: self.desc(),
            offset: (self.page() - 1).saturating_mul(per),
            limit: per,
        })
    }
    /// `/dlq?...` with these parameters, `changes` applied (an empty value
    /// removes a parameter).
    pub(super) fn href(&self, changes: &[(&str, String)]) -> String {
        let o = |v: &Option<String>| v.clone().unwrap_or_default();
        let mut params: Vec<(&str, String)> = vec![
            ("topic", self.select.topic.clone()),
            ("job", o(&self.select.job)),
            ("class", o(&self.select.class)),
            ("since", o(&self.select.since)),
            ("until", o(&self.select.until)),
            (
                "all",
                self.all
                    .as_ref()
                    .map(|_| "on".to_string())
                    .unwrap_or_default(),
            ),
            ("q", o(&self.q)),
            ("sort", o(&self.sort)),
            ("dir", o(&self.dir)),
            ("page", o(&self.page)),
            ("per", o(&self.per)),
        ];
        for (k, v) in changes {
            match params.iter_mut().find(|(name, _)| name == k) {
                Some(p) => p.1 = v.clone(),
                None => params.push((k, v.clone())),
            }
        }
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (k, v) in params.iter().filter(|(_, v)| !v.is_empty()) {
            out.append_pair(k, v);
        }
        format!("/dlq?{}", out.finish())
    }
    /// A column header that sorts by `sort` (again: the other direction).
    pub(super) fn sort_link(&self, sort: Sort, label: &str) -> Markup {
        let current = self.sort() == sort;
        let dir = if current {
            if self.desc() {
                "asc"
            } else {
                "desc"
            }
        } else if matches!(sort, Sort::Time | Sort::Attempts) {
            "desc"
        } else {
            "asc"
        };
        let mark = match (current, self.desc()) {
            (false, _) => "",
            (true, true) => " ↓",
            (true, false) => " ↑",
        };
        html! {
            a.sort data-sort=(sort.name()) href=(self.href(&[("sort", sort.name().into()), ("dir", dir.into()), ("page", String::new())])) { (label) (mark) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Query as Params;

    #[test]
    fn the_query_takes_the_cli_selection_with_empty_fields_as_absent() {
        let uri: axum::http::Uri = "/dlq?topic=orders&job=&class=permanent&since=2h&all=on"
            .parse()
            .unwrap();
        let Params(q) = Params::<DlqQuery>::try_from_uri(&uri).unwrap();
        assert_eq!(q.select.topic, "orders");
        assert_eq!(q.select.job, None, "an empty field is a filter not given");
        assert_eq!(q.select.class.as_deref(), Some("permanent"));
        assert_eq!(q.select.since.as_deref(), Some("2h"));
        assert!(q.all.is_some());
        let uri: axum::http::Uri = "/dlq".parse().unwrap();
        let Params(q) = Params::<DlqQuery>::try_from_uri(&uri).unwrap();
        assert!(q.select.topic.is_empty(), "no topic: the list of routes");
    }

    #[test]
    fn pages_and_sorts_parse_leniently_and_links_keep_the_rest() {
        let parse = |uri: &str| {
            let uri: axum::http::Uri = uri.parse().unwrap_or_else(|_| unreachable!());
            Params::<DlqQuery>::try_from_uri(&uri)
                .map(|Params(q)| q)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let q = parse("/dlq?topic=orders&q=a%26b&page=3&per=9999&sort=key&dir=desc");
        let iq = q.index_query().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((iq.offset, iq.limit), (2 * MAX_PER_PAGE, MAX_PER_PAGE));
        assert_eq!((iq.sort, iq.desc), (Sort::Key, true));
        assert_eq!(iq.search.as_deref(), Some("a&b"));
        let href = q.href(&[("page", "1".into()), ("q", String::new())]);
        assert_eq!(href, "/dlq?topic=orders&sort=key&dir=desc&page=1&per=9999");
        let q = parse("/dlq?topic=orders&page=0&per=x&sort=nope");
        let iq = q.index_query().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (iq.offset, iq.limit),
            (0, PER_PAGE),
            "bad values are defaults"
        );
        assert_eq!((iq.sort, iq.desc), (Sort::Time, true), "newest first");
        assert_eq!(iq.status, StatusFilter::Unresolved);
        // A column sorts ascending first, then flips.
        let link = q.sort_link(Sort::Key, "key").into_string();
        assert!(link.contains("sort=key&amp;dir=asc"), "{link}");
        let link = parse("/dlq?topic=o&sort=key&dir=asc")
            .sort_link(Sort::Key, "key")
            .into_string();
        assert!(link.contains("dir=desc") && link.contains('↑'), "{link}");
    }
}

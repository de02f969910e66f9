//! "Did you mean": the existing names nearest to a mistyped one (a group,
//! a topic, an error class), by edit distance, so an unknown name is an
//! error that also points at the right one.

/// Levenshtein distance between `a` and `b`, in characters.
pub fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Up to three of `candidates` near `wanted`, nearest first: within a third
/// of its length (at least 2 edits), or containing it, or contained in it
/// (a name typed without its prefix).
pub fn near<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let limit = (wanted.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter(|c| *c != wanted)
        .filter_map(|c| {
            let d = distance(wanted, c);
            let related = wanted.len() >= 3 && (c.contains(wanted) || wanted.contains(c));
            (d <= limit || related).then_some((d, c))
        })
        .collect();
    scored.sort();
    scored.dedup();
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// `; did you mean `a` or `b`?` for the names [`near`] finds, or nothing.
pub fn did_you_mean<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<String> = near(wanted, candidates)
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => format!("; did you mean {one}?"),
        [rest @ .., last] => format!("; did you mean {} or {last}?", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("permanant", "permanent"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn near_names_nearest_first() {
        let groups = ["orders-workers", "orders-worker", "billing", "mailer"];
        assert_eq!(
            near("orders-workr", groups),
            vec!["orders-worker", "orders-workers"]
        );
        assert_eq!(
            near("confirmation", ["orders.confirmation", "x"]),
            vec!["orders.confirmation"]
        );
        assert!(near("zzzzzzzz", groups).is_empty());
        assert_eq!(
            did_you_mean("permanant", ["permanent", "retryable"]),
            "; did you mean `permanent`?"
        );
        assert_eq!(did_you_mean("q", ["permanent"]), "");
    }
}

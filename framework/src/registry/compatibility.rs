//! A subject's compatibility level: which schema changes the registry
//! accepts under it. Plain vocabulary, shared by the registry client, the
//! schema checks and the errors that name a level.

use std::fmt;

/// A subject's compatibility level, as the Confluent API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compatibility {
    /// No checks.
    None,
    /// New reads the latest old.
    Backward,
    /// New reads every old.
    BackwardTransitive,
    /// Latest old reads new.
    Forward,
    /// Every old reads new.
    ForwardTransitive,
    /// Both directions, latest.
    Full,
    /// Both directions, all versions.
    FullTransitive,
}

impl std::str::FromStr for Compatibility {
    type Err = UnknownLevel;
    fn from_str(s: &str) -> Result<Self, UnknownLevel> {
        Ok(match s.to_ascii_uppercase().replace('-', "_").as_str() {
            "NONE" => Compatibility::None,
            "BACKWARD" => Compatibility::Backward,
            "BACKWARD_TRANSITIVE" => Compatibility::BackwardTransitive,
            "FORWARD" => Compatibility::Forward,
            "FORWARD_TRANSITIVE" => Compatibility::ForwardTransitive,
            "FULL" => Compatibility::Full,
            "FULL_TRANSITIVE" => Compatibility::FullTransitive,
            _ => return Err(UnknownLevel(s.to_string())),
        })
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Compatibility::None => "NONE",
            Compatibility::Backward => "BACKWARD",
            Compatibility::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Compatibility::Forward => "FORWARD",
            Compatibility::ForwardTransitive => "FORWARD_TRANSITIVE",
            Compatibility::Full => "FULL",
            Compatibility::FullTransitive => "FULL_TRANSITIVE",
        };
        f.write_str(s)
    }
}

impl Compatibility {
    pub(crate) fn transitive(self) -> bool {
        matches!(
            self,
            Compatibility::BackwardTransitive
                | Compatibility::ForwardTransitive
                | Compatibility::FullTransitive
        )
    }
    pub(crate) fn backward(self) -> bool {
        matches!(
            self,
            Compatibility::Backward
                | Compatibility::BackwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }
    pub(crate) fn forward(self) -> bool {
        matches!(
            self,
            Compatibility::Forward
                | Compatibility::ForwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }
}

/// A compatibility level the Confluent API does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown compatibility level `{0}`: use NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE")]
pub struct UnknownLevel(pub String);

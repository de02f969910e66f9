//! Consumer groups as the coordinator describes them: state, members and
//! each member's partition assignment. Read by replay (which refuses a live
//! group) and by the operator dashboard (which finds routes from the groups
//! that consume them). Blocking: call it from `spawn_blocking`.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// One member of a consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// Member id assigned by the coordinator.
    pub id: String,
    /// The member's `client.id`.
    pub client_id: String,
    /// The member's host.
    pub host: String,
    /// Partitions assigned to the member, per topic (empty while the group
    /// rebalances or when the assignment is not in the consumer protocol).
    pub assignment: Vec<(String, Vec<i32>)>,
}

/// A consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Group id.
    pub name: String,
    /// Coordinator state: `Stable`, `PreparingRebalance`, `Empty`, `Dead`, ...
    pub state: String,
    /// Live members.
    pub members: Vec<GroupMember>,
}

impl Group {
    /// Every topic some member is assigned, sorted, without duplicates.
    pub fn assigned_topics(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .members
            .iter()
            .flat_map(|m| m.assignment.iter().map(|(t, _)| t.clone()))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Describes `only` (one group) or every group the cluster knows.
pub fn describe_groups(config: &KafkaConfig, only: Option<&str>) -> Result<Vec<Group>> {
    let c: BaseConsumer = config
        .client_config(&[
            ("group.id", only.unwrap_or("kjob-group-reader")),
            ("enable.auto.commit", "false"),
        ])
        .create()
        .map_err(|e| Error::kafka("creating group reader", e))?;
    let list = c
        .fetch_group_list(only, Duration::from_secs(10))
        .map_err(|e| Error::kafka(format!("describing group `{}`", only.unwrap_or("*")), e))?;
    Ok(list
        .groups()
        .iter()
        .map(|g| Group {
            name: g.name().to_string(),
            state: g.state().to_string(),
            members: g
                .members()
                .iter()
                .map(|m| GroupMember {
                    id: m.id().to_string(),
                    client_id: m.client_id().to_string(),
                    host: m.client_host().to_string(),
                    assignment: m.assignment().map(parse_assignment).unwrap_or_default(),
                })
                .collect(),
        })
        .collect())
}

/// Decodes a consumer-protocol `Assignment` (version, then an array of
/// topic name and partition array, then user data). Malformed bytes give
/// what was read before the error: the page shows less, nothing fails.
fn parse_assignment(bytes: &[u8]) -> Vec<(String, Vec<i32>)> {
    let mut r = Reader { bytes, at: 0 };
    let mut out = Vec::new();
    let _version = r.i16();
    let Some(topics) = r.i32() else {
        return out;
    };
    for _ in 0..topics.max(0) {
        let Some(name) = r.string() else { break };
        let Some(n) = r.i32() else { break };
        let parts: Vec<i32> = (0..n.max(0)).map_while(|_| r.i32()).collect();
        out.push((name, parts));
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = usize::try_from(self.i16()?).ok()?;
        Some(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_bytes() {
        let mut b = vec![0, 1, 0, 0, 0, 1, 0, 6];
        b.extend_from_slice(b"orders");
        b.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0]);
        assert_eq!(
            parse_assignment(&b),
            vec![("orders".to_string(), vec![0, 3])]
        );
        assert_eq!(parse_assignment(&b[..9]), vec![]);
        assert_eq!(parse_assignment(&[]), vec![]);
    }
}

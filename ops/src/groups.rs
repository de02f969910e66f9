//! Consumer groups as the coordinator describes them: state, members and
//! each member's partition assignment. Read by replay (which refuses a live
//! group), `kjob status` and the operator dashboard. Blocking: call it from
//! `spawn_blocking`.
//!
//! Why not rust-rdkafka's `fetch_group_list`: it speaks the classic
//! DescribeGroups API, to which a KIP-848 group (kjob's default protocol)
//! answers as if it had no members, so replay would not see a live worker.
//! librdkafka's `DescribeConsumerGroups` admin call asks each group in the
//! protocol it speaks (ConsumerGroupDescribe for KIP-848, DescribeGroups for
//! classic) and returns assignments already decoded; rust-rdkafka does not
//! wrap it, so this module calls it through `rdkafka::bindings`, keeping the
//! unsafe code in one place.

use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;

use kjob::config::KafkaConfig;
use kjob::error::{Error, Result};

/// One member of a consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// Member id assigned by the coordinator (KIP-848: by the client).
    pub id: String,
    /// The member's `client.id`.
    pub client_id: String,
    /// The member's host.
    pub host: String,
    /// Partitions assigned to the member, per topic (empty while the group
    /// rebalances).
    pub assignment: Vec<(String, Vec<i32>)>,
}

/// A consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Group id.
    pub name: String,
    /// Coordinator state: `Stable`, `PreparingRebalance`, `Empty`, `Dead`, ...
    pub state: String,
    /// The group's protocol: `Classic` or `Consumer` (KIP-848).
    pub protocol: String,
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

const TIMEOUT: Duration = Duration::from_secs(10);

/// An admin error with librdkafka's words in the context.
fn admin_error(context: String, code: rd::rd_kafka_resp_err_t) -> Error {
    Error::Kafka {
        context,
        source: rdkafka::error::KafkaError::AdminOp(code.into()),
    }
}

/// Describes `only` (one group) or every consumer group the cluster knows.
/// A group the coordinator does not know comes back in state `Dead` with
/// no members.
pub fn describe_groups(config: &KafkaConfig, only: Option<&str>) -> Result<Vec<Group>> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating the group reader", e))?;
    let names = match only {
        Some(g) => vec![g.to_string()],
        None => list_groups(&admin)?,
    };
    if names.is_empty() {
        return Ok(Vec::new());
    }
    describe(&admin, &names)
}

/// The name of every consumer group the cluster knows, sorted: what a
/// mistyped `--group` is compared with. Blocking.
pub fn group_names(config: &KafkaConfig) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating the group reader", e))?;
    let mut names = list_groups(&admin)?;
    names.sort();
    Ok(names)
}

/// The topics on which `group` has committed offsets (what
/// `kafka-consumer-groups --describe` shows for a group without members),
/// sorted. Blocking.
pub fn committed_topics(config: &KafkaConfig, group: &str) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating the group reader", e))?;
    committed_topics_with(&admin, group)
}

/// [`committed_topics`] of each of `groups`, through one admin client and
/// up to 16 requests in flight (one group per request, as the admin API
/// takes them): the dashboard reads many idle groups at once. Blocking.
pub fn committed_topics_of(
    config: &KafkaConfig,
    groups: &[String],
) -> Result<Vec<(String, Result<Vec<String>>)>> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating the group reader", e))?;
    let mut out = Vec::with_capacity(groups.len());
    for chunk in groups.chunks(16) {
        let read: Vec<(String, Result<Vec<String>>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|g| {
                    let admin = &admin;
                    scope.spawn(move || (g.clone(), committed_topics_with(admin, g)))
                })
                .collect();
            handles
                .into_iter()
                .zip(chunk)
                .map(|(h, g)| {
                    h.join().unwrap_or_else(|_| {
                        (
                            g.clone(),
                            Err(Error::Task {
                                what: "listing a group's committed offsets",
                                reason: "the reading thread panicked".into(),
                            }),
                        )
                    })
                })
                .collect()
        });
        out.extend(read);
    }
    Ok(out)
}

fn committed_topics_with(
    admin: &AdminClient<DefaultClientContext>,
    group: &str,
) -> Result<Vec<String>> {
    let name = CString::new(group).map_err(|_| Error::InvalidSetting {
        name: "group".into(),
        value: group.to_string(),
        reason: "a group id cannot contain a NUL byte".into(),
    })?;
    // SAFETY: `name` outlives the call (librdkafka copies it); a null
    // partition list asks for every committed partition.
    let request_ptr =
        unsafe { rd::rd_kafka_ListConsumerGroupOffsets_new(name.as_ptr(), std::ptr::null()) };
    let owned = Owned {
        ptr: request_ptr,
        free: rd::rd_kafka_ListConsumerGroupOffsets_destroy,
    };
    let mut requests = [owned.ptr];
    let event = request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS,
        "listing a group's committed offsets",
        // SAFETY: `requests` holds one live request, alive until this call
        // returns (librdkafka copies it).
        |rk, options, queue| unsafe {
            rd::rd_kafka_ListConsumerGroupOffsets(rk, requests.as_mut_ptr(), 1, options, queue)
        },
    )?;
    let mut topics = std::collections::BTreeSet::new();
    // SAFETY: `event` is a ListConsumerGroupOffsets result; the group
    // results, their partition lists and strings live as long as `event`.
    unsafe {
        let result = rd::rd_kafka_event_ListConsumerGroupOffsets_result(event.ptr);
        if result.is_null() {
            return Ok(Vec::new());
        }
        let mut n = 0usize;
        let groups = rd::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut n);
        for i in 0..n {
            let g = *groups.add(i);
            let error = rd::rd_kafka_group_result_error(g);
            if !error.is_null() {
                let code = rd::rd_kafka_error_code(error);
                if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND {
                    continue;
                }
                return Err(admin_error(
                    format!(
                        "listing the committed offsets of group `{group}`: {}",
                        text(rd::rd_kafka_error_string(error))
                    ),
                    code,
                ));
            }
            let list = rd::rd_kafka_group_result_partitions(g);
            if list.is_null() {
                continue;
            }
            let cnt = usize::try_from((*list).cnt).unwrap_or(0);
            for j in 0..cnt {
                let tp = &*(*list).elems.add(j);
                if tp.offset >= 0 {
                    topics.insert(text(tp.topic));
                }
            }
        }
    }
    Ok(topics.into_iter().collect())
}

/// Owns a librdkafka handle and frees it on drop.
struct Owned<T> {
    ptr: *mut T,
    free: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from the matching librdkafka constructor
            // and is freed exactly once, here.
            unsafe { (self.free)(self.ptr) }
        }
    }
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka returns NUL-terminated strings that live as long
    // as the result event, which outlives every call of this function.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Runs one admin request on a fresh queue and waits for its result event.
fn request(
    admin: &AdminClient<DefaultClientContext>,
    op: rd::rd_kafka_admin_op_t,
    what: &str,
    send: impl FnOnce(
        *mut rd::rd_kafka_t,
        *const rd::rd_kafka_AdminOptions_t,
        *mut rd::rd_kafka_queue_t,
    ),
) -> Result<Owned<rd::rd_kafka_event_t>> {
    let rk = admin.inner().native_ptr();
    // SAFETY: `rk` is a live client for the whole function (borrowed from
    // `admin`); every handle created here is wrapped in `Owned` at once.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_new(rk),
            free: rd::rd_kafka_queue_destroy,
        };
        let options = Owned {
            ptr: rd::rd_kafka_AdminOptions_new(rk, op),
            free: rd::rd_kafka_AdminOptions_destroy,
        };
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr,
            TIMEOUT.as_millis() as i32,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        send(rk, options.ptr, queue.ptr);
        let event = Owned {
            ptr: rd::rd_kafka_queue_poll(queue.ptr, (TIMEOUT.as_millis() + 2_000) as i32),
            free: rd::rd_kafka_event_destroy,
        };
        if event.ptr.is_null() {
            return Err(admin_error(
                format!("{what}: no answer within {TIMEOUT:?}"),
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT,
            ));
        }
        let err = rd::rd_kafka_event_error(event.ptr);
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(admin_error(
                format!(
                    "{what}: {}",
                    text(rd::rd_kafka_event_error_string(event.ptr))
                ),
                err,
            ));
        }
        Ok(event)
    }
}

fn list_groups(admin: &AdminClient<DefaultClientContext>) -> Result<Vec<String>> {
    let event = request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPS,
        "listing consumer groups",
        // SAFETY: the pointers are live handles made by `request`.
        |rk, options, queue| unsafe { rd::rd_kafka_ListConsumerGroups(rk, options, queue) },
    )?;
    // SAFETY: `event` is a ListConsumerGroups result (checked for errors);
    // the listing array and its strings live as long as `event`.
    unsafe {
        let result = rd::rd_kafka_event_ListConsumerGroups_result(event.ptr);
        if result.is_null() {
            return Ok(Vec::new());
        }
        let mut n = 0usize;
        let listings = rd::rd_kafka_ListConsumerGroups_result_valid(result, &mut n);
        Ok((0..n)
            .map(|i| text(rd::rd_kafka_ConsumerGroupListing_group_id(*listings.add(i))))
            .collect())
    }
}

fn describe(admin: &AdminClient<DefaultClientContext>, names: &[String]) -> Result<Vec<Group>> {
    let c_names: Vec<CString> = names
        .iter()
        .map(|n| {
            CString::new(n.as_str()).map_err(|_| Error::InvalidSetting {
                name: "group".into(),
                value: n.clone(),
                reason: "a group id cannot contain a NUL byte".into(),
            })
        })
        .collect::<Result<_>>()?;
    let mut ptrs: Vec<*const c_char> = c_names.iter().map(|c| c.as_ptr()).collect();
    let event = request(
        admin,
        rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        "describing consumer groups",
        // SAFETY: `ptrs` points into `c_names`, both alive until this call
        // returns (librdkafka copies the names).
        |rk, options, queue| unsafe {
            rd::rd_kafka_DescribeConsumerGroups(rk, ptrs.as_mut_ptr(), ptrs.len(), options, queue)
        },
    )?;
    let mut out = Vec::with_capacity(names.len());
    // SAFETY: `event` is a DescribeConsumerGroups result; every description,
    // member, assignment and string read below lives as long as `event`.
    unsafe {
        let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event.ptr);
        if result.is_null() {
            return Ok(out);
        }
        let mut n = 0usize;
        let groups = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut n);
        for i in 0..n {
            let g = *groups.add(i);
            let name = text(rd::rd_kafka_ConsumerGroupDescription_group_id(g));
            let error = rd::rd_kafka_ConsumerGroupDescription_error(g);
            if !error.is_null() {
                let code = rd::rd_kafka_error_code(error);
                if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND {
                    out.push(Group {
                        name,
                        state: "Dead".into(),
                        protocol: String::new(),
                        members: Vec::new(),
                    });
                    continue;
                }
                return Err(admin_error(
                    format!(
                        "describing group `{name}`: {}",
                        text(rd::rd_kafka_error_string(error))
                    ),
                    code,
                ));
            }
            let state = text(rd::rd_kafka_consumer_group_state_name(
                rd::rd_kafka_ConsumerGroupDescription_state(g),
            ));
            let protocol = text(rd::rd_kafka_consumer_group_type_name(
                rd::rd_kafka_ConsumerGroupDescription_type(g),
            ));
            let count = rd::rd_kafka_ConsumerGroupDescription_member_count(g);
            let members = (0..count)
                .map(|m| {
                    let member = rd::rd_kafka_ConsumerGroupDescription_member(g, m);
                    GroupMember {
                        id: text(rd::rd_kafka_MemberDescription_consumer_id(member)),
                        client_id: text(rd::rd_kafka_MemberDescription_client_id(member)),
                        host: text(rd::rd_kafka_MemberDescription_host(member)),
                        assignment: assignment(rd::rd_kafka_MemberDescription_assignment(member)),
                    }
                })
                .collect();
            out.push(Group {
                name,
                state,
                protocol,
                members,
            });
        }
    }
    Ok(out)
}

/// Per topic, the partitions of a member's assignment, sorted.
///
/// # Safety
/// `assignment` is null or a member assignment of a live result event.
unsafe fn assignment(
    assignment: *const rd::rd_kafka_MemberAssignment_t,
) -> Vec<(String, Vec<i32>)> {
    if assignment.is_null() {
        return Vec::new();
    }
    let list = rd::rd_kafka_MemberAssignment_partitions(assignment);
    if list.is_null() {
        return Vec::new();
    }
    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
    let cnt = usize::try_from((*list).cnt).unwrap_or(0);
    for i in 0..cnt {
        let tp = &*(*list).elems.add(i);
        by_topic
            .entry(text(tp.topic))
            .or_default()
            .push(tp.partition);
    }
    by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            (t, ps)
        })
        .collect()
}

//! Topics before the first poll: the preflight checks (registry up, main
//! topics present) and the creation of every topic a route needs and may
//! lack (retry tiers, DLQ, delay buckets, strict order, schedules).

use std::collections::HashMap;

use tracing::warn;

use crate::error::{Error, Result};
use crate::topics::{create_topics, create_topics_with, dlq_topic};

use crate::worker::state::TopicRole;
use crate::worker::{before::strict, Worker};

impl Worker {
    /// A route not declared to take delayed jobs whose delay topics exist
    /// (an earlier layout created them, or an operator did) is served as
    /// one that does, with a warning: records still waiting there run at
    /// their time instead of being stranded. `kjob topics plan` shows when
    /// the topics are drained and can be deleted; after that the route
    /// runs without them.
    ///
    /// A route that shares delay buckets (`SharedTiers::delay_buckets`)
    /// reads its own delay topics the same way while they exist (the
    /// layout before the upgrade, or a producer not yet told the
    /// namespace); the jobs there hop on into the shared buckets.
    /// `listed`: every topic of the cluster, when the caller has them.
    pub(in crate::worker) async fn adopt_delay_topics(
        &mut self,
        listed: Option<&[String]>,
    ) -> Result<()> {
        let plain: Vec<String> = self
            .routes
            .iter()
            .filter(|(t, e)| {
                e.role == TopicRole::Main && **t == e.main && (!e.delays || *e.delays_at != ***t)
            })
            .map(|(t, _)| t.clone())
            .collect();
        if plain.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = plain
            .iter()
            .flat_map(|m| crate::delay::delay_topics(m))
            .collect();
        let counts: Vec<Option<usize>> = match listed {
            // Existence is all that matters here.
            Some(all) => {
                let all: std::collections::HashSet<&str> = all.iter().map(String::as_str).collect();
                names
                    .iter()
                    .map(|n| all.contains(n.as_str()).then_some(1))
                    .collect()
            }
            // A principal granted only its model's topics may not describe
            // these (they are not in it): then it could not read them
            // either, so there is nothing to adopt.
            None => match crate::topics::partition_counts_async(&self.config, &names).await {
                Err(Error::NotAuthorized { .. }) => {
                    tracing::debug!(
                        "this principal may not describe the routes' own delay topics (outside its model); none adopted"
                    );
                    vec![None; names.len()]
                }
                other => other?,
            },
        };
        let per_route = crate::delay::delay_topics("x").len();
        for (main, found) in plain.iter().zip(counts.chunks(per_route)) {
            let existing = found.iter().filter(|c| c.is_some()).count();
            if existing == 0 {
                continue;
            }
            let Some(base) = self.routes.get(main).cloned() else {
                continue;
            };
            match base.delays {
                true => {
                    warn!(route = %main, delay_topics = existing, "the route shares delay buckets now, but its own delay topics exist: reading them until they are drained (their jobs hop on into the shared buckets); `kjob topics plan --shared-tiers` shows when they can be deleted")
                }
                false => {
                    warn!(route = %main, delay_topics = existing, "the route is not declared to take delayed jobs (delayed_jobs_on), but its delay topics exist: serving them so that what waits there runs at its time; `kjob topics plan` shows when they are drained and can be deleted")
                }
            }
            for entry in self.routes.values_mut().filter(|e| e.main == *main) {
                entry.delays = true;
            }
            for (i, topic) in crate::delay::delay_topics(main).into_iter().enumerate() {
                self.priorities.insert(topic.clone(), base.priority);
                self.routes.insert(
                    topic,
                    crate::worker::state::RouteEntry {
                        role: TopicRole::Delay(i),
                        delays: true,
                        ..base.clone()
                    },
                );
            }
        }
        Ok(())
    }

    /// A route that shares its retry tiers (`WorkerBuilder::shared_retry_tiers`)
    /// whose own tier topics still exist (the per-route layout before the
    /// upgrade) reads them too, with a warning: jobs parked there run at
    /// their due time, and a job that fails again goes on into the shared
    /// tiers, so nothing is stranded by the change of layout and the old
    /// topics drain. `kjob topics plan --shared-tiers` shows when they are
    /// drained and can be deleted.
    /// `listed` is every topic of the cluster ([`Worker::list_for_adoption`]).
    pub(in crate::worker) async fn adopt_route_tiers(
        &mut self,
        listed: Option<&[String]>,
    ) -> Result<()> {
        let (sharing, Some(all)) = (self.sharing_routes(), listed) else {
            return Ok(());
        };
        for (main, base) in sharing {
            for (delay, topic) in crate::retry::discover_tiers(&main, all) {
                if self.routes.contains_key(&topic) {
                    continue;
                }
                warn!(route = %main, tier = %topic, "the route shares its retry tiers now, but its own tier topic exists: reading it until it is drained (what fails again goes to the shared tiers); `kjob topics plan --shared-tiers` shows when it can be deleted");
                let i = base
                    .retry
                    .tiers
                    .iter()
                    .position(|t| *t == delay)
                    .unwrap_or(0);
                self.priorities.insert(topic.clone(), base.priority);
                self.routes.insert(
                    topic,
                    crate::worker::state::RouteEntry {
                        role: TopicRole::Tier(i),
                        ..base.clone()
                    },
                );
            }
        }
        Ok(())
    }

    /// The main topics of routes that share their retry tiers, with their
    /// entries.
    fn sharing_routes(&self) -> Vec<(String, crate::worker::state::RouteEntry)> {
        self.routes
            .iter()
            .filter(|(t, e)| e.role == TopicRole::Main && **t == e.main && *e.tiers_at != **t)
            .map(|(t, e)| (t.clone(), e.clone()))
            .collect()
    }

    /// Every topic of the cluster when a route shares its retry tiers (its
    /// own old tiers are found by listing), else `None`: a full listing is
    /// slow on a cluster of tens of thousands of partitions, so it is only
    /// made when needed.
    pub(in crate::worker) async fn list_for_adoption(&self) -> Result<Option<Vec<String>>> {
        if self.sharing_routes().is_empty() {
            return Ok(None);
        }
        let config = self.config.clone();
        let all = tokio::task::spawn_blocking(move || crate::topics::list_topics(&config))
            .await
            .map_err(|e| Error::Task {
                what: "listing topics for a route's old retry tiers",
                reason: e.to_string(),
            })??;
        Ok(Some(all))
    }

    /// With `WorkerBuilder::create_main_topics` (development only), creates
    /// each missing main topic with the partition count given there and
    /// logs it; without, it does nothing and [`Worker::preflight`] refuses
    /// a missing main topic. Runs before anything reads the topics, so the
    /// adoption of old tiers and the preflight see the new topic.
    pub(in crate::worker) async fn create_missing_mains(&self) -> Result<()> {
        let Some(partitions) = self.create_main_topics else {
            return Ok(());
        };
        let counts = crate::topics::partition_counts_async(&self.config, &self.mains).await?;
        let missing: Vec<(String, i32)> = self
            .mains
            .iter()
            .zip(counts)
            .filter(|(_, n)| n.is_none())
            .map(|(t, _)| (t.clone(), i32::try_from(partitions).unwrap_or(i32::MAX)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        create_topics(&self.config, &missing).await?;
        // Existing topics are left alone, so one created meanwhile (by a
        // producer's first write under the broker's
        // `auto.create.topics.enable`) keeps its own count: say which.
        let names: Vec<String> = missing.iter().map(|(t, _)| t.clone()).collect();
        let now = crate::topics::partition_counts_async(&self.config, &names).await?;
        for (topic, found) in names.iter().zip(now) {
            match found {
                Some(n) if n == partitions => tracing::info!(
                    topic = %topic, partitions,
                    "created the missing main topic (create_main_topics is a development setting; in production create it beforehand: `kjob topics create --topic {topic} --partitions N`)"
                ),
                found => tracing::warn!(
                    topic = %topic, asked = partitions, partitions = ?found,
                    "the missing main topic was created meanwhile by someone else (a producer's first write under the broker's auto.create.topics.enable, say), with the broker's default partition count"
                ),
            }
        }
        Ok(())
    }

    /// Fails fast, with a clear message, if the registry is down or a main
    /// topic is missing; creates missing retry-tier and DLQ topics (with the
    /// main topic's partition count) when allowed, and warns about existing
    /// ones whose partition count differs.
    pub(in crate::worker) async fn preflight(&self) -> Result<()> {
        self.codec.ping().await?;
        self.check_readers().await?;
        if !self.schedules.is_empty() {
            self.schedule_topics().await?;
        }
        if let Some(topic) = &self.batches {
            self.batch_topics(topic).await?;
        }
        let mut wanted: Vec<(String, String)> = Vec::new(); // (topic, its main topic)
        for main in &self.mains {
            wanted.push((main.clone(), main.clone()));
            wanted.push((dlq_topic(main), main.clone()));
        }
        for (topic, entry) in &self.routes {
            if entry.role.holds() && entry.sharers.is_none() {
                wanted.push((topic.clone(), entry.main.clone()));
            }
        }
        self.shared_tier_topics().await?;
        let names: Vec<String> = wanted.iter().map(|(t, _)| t.clone()).collect();
        let counts = crate::topics::partition_counts_async(&self.config, &names).await?;
        let count_of: HashMap<&str, Option<usize>> = wanted
            .iter()
            .map(|(t, _)| t.as_str())
            .zip(counts.iter().copied())
            .collect();
        let mut missing = Vec::new();
        for (topic, main) in &wanted {
            // A DLQ with a partition count of its own (dlq_partitions).
            let own = self
                .dlq_partitions
                .filter(|_| topic != main && *topic == dlq_topic(main));
            let main_count = count_of.get(main.as_str()).copied().flatten();
            let Some(main_count) = main_count else {
                return Err(Error::MissingTopic {
                    topic: main.clone(),
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            };
            match count_of.get(topic.as_str()).copied().flatten() {
                Some(n) if n != main_count && own.is_none() => warn!(
                    topic = %topic, partitions = n, main = %main, main_partitions = main_count,
                    "partition count differs from the main topic"
                ),
                Some(_) => {}
                None if self.create_topics => {
                    missing.push((topic.clone(), own.unwrap_or(main_count) as i32))
                }
                None => {
                    return Err(Error::MissingTopic {
                        topic: topic.clone(),
                        bootstrap: self.config.bootstrap_servers.clone(),
                    })
                }
            }
        }
        // A tier or DLQ must take whatever its main topic accepted, plus
        // kjob's headers; otherwise a large record could never be forwarded.
        let mains_of_missing: Vec<String> = {
            let mut m: Vec<String> = missing
                .iter()
                .filter_map(|(t, _)| wanted.iter().find(|(w, _)| w == t).map(|(_, m)| m.clone()))
                .collect();
            m.sort();
            m.dedup();
            m
        };
        let limits = crate::topics::max_message_bytes(&self.config, &mains_of_missing).await;
        let retention = crate::delay::CREATED_RETENTION.as_millis().to_string();
        for (main, limit) in mains_of_missing.iter().zip(limits) {
            let of_main: Vec<(String, i32)> = missing
                .iter()
                .filter(|(t, _)| wanted.iter().any(|(w, m)| w == t && m == main))
                .cloned()
                .collect();
            // Delay topics also get an explicit retention (the delay
            // producer checks it), whatever the broker's default.
            let (delays, topics): (Vec<_>, Vec<_>) = of_main.into_iter().partition(|(t, _)| {
                self.routes
                    .get(t)
                    .is_some_and(|e| matches!(e.role, TopicRole::Delay(_)))
            });
            let sized =
                limit.map(|bytes| (bytes + crate::topics::FORWARD_HEADROOM_BYTES).to_string());
            let mut cfg: Vec<(&str, &str)> = Vec::new();
            if let Some(sized) = &sized {
                cfg.push(("max.message.bytes", sized));
            }
            match cfg.is_empty() {
                false => create_topics_with(&self.config, &topics, &cfg).await?,
                true => create_topics(&self.config, &topics).await?,
            }
            cfg.push(("retention.ms", &retention));
            create_topics_with(&self.config, &delays, &cfg).await?;
        }
        if !missing.is_empty() {
            let created: Vec<String> = missing.iter().map(|(t, _)| t.clone()).collect();
            crate::topics::wait_visible(&self.config, &created).await?;
        }
        if self.create_topics {
            crate::control::provision(&self.config, &self.settings.group).await;
        }
        self.strict_topics().await
    }

    /// The shared retry tiers and delay buckets
    /// (`WorkerBuilder::shared_retry_tiers`), created
    /// when missing and allowed: with the set partition count, else the
    /// largest of the sharing routes' main topics, and a record size limit
    /// that takes the largest record any of them accepts plus kjob's
    /// headers. An existing one is used as it is: its partition count is
    /// its own.
    async fn shared_tier_topics(&self) -> Result<()> {
        let shared: Vec<(&String, Vec<String>)> = self
            .routes
            .iter()
            .filter_map(|(topic, e)| {
                let mut mains: Vec<String> = e.sharers.as_ref()?.keys().cloned().collect();
                mains.sort();
                Some((topic, mains))
            })
            .collect();
        if shared.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = shared.iter().map(|(t, _)| (*t).clone()).collect();
        let counts = crate::topics::partition_counts_async(&self.config, &names).await?;
        let missing: Vec<&(&String, Vec<String>)> = shared
            .iter()
            .zip(&counts)
            .filter(|(_, c)| c.is_none())
            .map(|(s, _)| s)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if !self.create_topics {
            return Err(Error::MissingTopic {
                topic: missing[0].0.clone(),
                bootstrap: self.config.bootstrap_servers.clone(),
            });
        }
        let mut mains: Vec<String> = missing.iter().flat_map(|(_, m)| m.clone()).collect();
        mains.sort();
        mains.dedup();
        let main_counts = crate::topics::partition_counts_async(&self.config, &mains).await?;
        let limits = crate::topics::max_message_bytes(&self.config, &mains).await;
        let of = |main: &String| mains.iter().position(|m| m == main);
        let retention = crate::delay::CREATED_RETENTION.as_millis().to_string();
        for (topic, sharing) in &missing {
            let at: Vec<usize> = sharing.iter().filter_map(of).collect();
            let partitions = self.shared_tier_partitions.unwrap_or_else(|| {
                at.iter()
                    .filter_map(|i| main_counts.get(*i).copied().flatten())
                    .max()
                    .unwrap_or(1)
            });
            let limit = at
                .iter()
                .filter_map(|i| limits.get(*i).copied().flatten())
                .max();
            let sized = limit.map(|b| (b + crate::topics::FORWARD_HEADROOM_BYTES).to_string());
            let wanted = [((*topic).clone(), partitions as i32)];
            let mut cfg: Vec<(&str, &str)> = Vec::new();
            if let Some(bytes) = &sized {
                cfg.push(("max.message.bytes", bytes));
            }
            // A delay bucket gets an explicit retention (the delay producer
            // checks it), whatever the broker's default.
            let bucket = self
                .routes
                .get(*topic)
                .is_some_and(|e| matches!(e.role, TopicRole::Delay(_)));
            if bucket {
                cfg.push(("retention.ms", &retention));
            }
            match cfg.is_empty() {
                true => create_topics(&self.config, &wanted).await?,
                false => create_topics_with(&self.config, &wanted, &cfg).await?,
            }
        }
        let created: Vec<String> = missing.iter().map(|(t, _)| (*t).clone()).collect();
        crate::topics::wait_visible(&self.config, &created).await
    }

    /// For every strict-order route: the compacted `<main>.order` topic,
    /// created with the main topic's partition count when missing and
    /// allowed, and the same partition count on the main topic, its tiers
    /// and its order topic (partition *n* of each must be one member's).
    async fn strict_topics(&self) -> Result<()> {
        for main in &self.strict {
            let order = strict::order_topic(main);
            let mut names = vec![main.clone(), order.clone()];
            names.extend(
                self.routes
                    .iter()
                    .filter(|(_, e)| e.main == *main && matches!(e.role, TopicRole::Tier(_)))
                    .map(|(t, _)| t.clone()),
            );
            let counts = crate::topics::partition_counts_async(&self.config, &names).await?;
            let Some(Some(main_count)) = counts.first().copied() else {
                return Err(Error::MissingTopic {
                    topic: main.clone(),
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            };
            for (topic, count) in names.iter().zip(&counts).skip(1) {
                match count {
                    Some(n) if *n != main_count => {
                        return Err(Error::InvalidSetting {
                            name: "strict_order".into(),
                            value: main.clone(),
                            reason: format!(
                                "`{topic}` has {n} partitions and `{main}` {main_count}; strict \
                                 order keeps a key's records on one partition number across \
                                 them, so they must match: recreate `{topic}` with \
                                 {main_count} partitions (or add partitions to it), or drop \
                                 strict_order"
                            ),
                        })
                    }
                    Some(_) => {}
                    None if topic == &order && self.create_topics => {
                        create_topics_with(
                            &self.config,
                            &[(order.clone(), main_count as i32)],
                            &[("cleanup.policy", "compact")],
                        )
                        .await?;
                        crate::topics::wait_visible(&self.config, std::slice::from_ref(&order))
                            .await?;
                    }
                    None => {
                        return Err(Error::MissingTopic {
                            topic: topic.clone(),
                            bootstrap: self.config.bootstrap_servers.clone(),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// The batch topic and its compacted state topic (with the same
    /// partition count: a batch's snapshot goes to its events' partition
    /// number), created when missing and allowed. The state topic takes
    /// records up to 64 MiB: an open batch's snapshot holds its finished
    /// job ids (16 bytes each, 3.2 MB for 200 000).
    async fn batch_topics(&self, topic: &str) -> Result<()> {
        let state = crate::batch::state_topic(topic);
        let names = vec![topic.to_string(), state.clone()];
        let counts = crate::topics::partition_counts_async(&self.config, &names).await?;
        let events = counts.first().copied().flatten();
        let snapshots = counts.get(1).copied().flatten();
        let partitions = events.map_or(crate::batch::DEFAULT_PARTITIONS, |n| n as i32);
        for (name, count, cfg) in [
            (
                topic.to_string(),
                events,
                &[("retention.ms", "604800000")][..],
            ),
            (
                state.clone(),
                snapshots,
                &[
                    ("cleanup.policy", "compact"),
                    ("max.message.bytes", crate::producer::MAX_MESSAGE_BYTES),
                ][..],
            ),
        ] {
            if count.is_some() {
                continue;
            }
            if !self.create_topics {
                return Err(Error::MissingTopic {
                    topic: name,
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            }
            create_topics_with(&self.config, &[(name.clone(), partitions)], cfg).await?;
            crate::topics::wait_visible(&self.config, &[name]).await?;
        }
        if let (Some(e), Some(s)) = (events, snapshots) {
            if s < e {
                return Err(Error::InvalidSetting {
                    name: "batches_on".into(),
                    value: topic.to_string(),
                    reason: format!("`{state}` has {s} partitions, fewer than the {e} of `{topic}`; a batch's snapshot goes to its events' partition number: add partitions to `{state}`"),
                });
            }
        }
        Ok(())
    }

    /// The schedule leader topic (one partition) and the compacted state
    /// topic (one partition), created when missing and allowed.
    async fn schedule_topics(&self) -> Result<()> {
        let group = &self.settings.group;
        let leader = crate::schedule::leader_topic(group);
        let state = crate::schedule::state_topic(group);
        let names = vec![leader.clone(), state.clone()];
        let counts = crate::topics::partition_counts_async(&self.config, &names).await?;
        for ((topic, count), compact) in [leader, state].into_iter().zip(counts).zip([false, true])
        {
            if count.is_some() {
                continue;
            }
            if !self.create_topics {
                return Err(Error::MissingTopic {
                    topic,
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            }
            let cfg: &[(&str, &str)] = if compact {
                &[("cleanup.policy", "compact")]
            } else {
                &[]
            };
            create_topics_with(&self.config, &[(topic.clone(), 1)], cfg).await?;
            crate::topics::wait_visible(&self.config, &[topic]).await?;
        }
        Ok(())
    }
}

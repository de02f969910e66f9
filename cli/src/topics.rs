//! `kjob topics create`: a route's main topic, retry tiers and DLQ (and
//! with `--delays` its delay topics, with `--strict-order` its compacted
//! order topic) in one go.

use anyhow::{anyhow, Result};
use clap::Subcommand;

use kjob::config::KafkaConfig;
use kjob::delay::{delay_topics, CREATED_RETENTION};
use kjob::retry::{parse_delay, RetryPolicy};
use kjob::topics::{create_topics, create_topics_with, dlq_topic, order_topic};

#[derive(Subcommand, Debug)]
pub enum TopicsCommand {
    /// Create a route: `<topic>`, `<topic>.retry.<delay>` per tier and `<topic>.dlq`.
    Create {
        /// Main topic (the job's name).
        #[arg(long)]
        topic: String,
        /// Partitions for every topic of the route.
        #[arg(long, default_value_t = 6)]
        partitions: i32,
        /// Retry tiers, comma-separated (`5s,30s,5m,30m`).
        #[arg(long, default_value = "5s,30s,5m,30m")]
        tiers: String,
        /// Also the delay topics `<topic>.delay.<bucket>` (1s..1d) that
        /// `enqueue_in` / `kjob enqueue --in` write to, keeping records 7 days.
        #[arg(long)]
        delays: bool,
        /// Also the compacted `<topic>.order` topic a route under
        /// `WorkerBuilder::strict_order` keeps its waiting jobs' order in.
        #[arg(long)]
        strict_order: bool,
    },
}

pub async fn run(config: &KafkaConfig, cmd: TopicsCommand) -> Result<()> {
    match cmd {
        TopicsCommand::Create {
            topic,
            partitions,
            tiers,
            delays: with_delays,
            strict_order,
        } => {
            if partitions < 1 {
                return Err(anyhow!("--partitions must be at least 1, got {partitions}"));
            }
            let delays = tiers
                .split(',')
                .filter(|t| !t.trim().is_empty())
                .map(|t| {
                    parse_delay(t.trim()).ok_or_else(|| {
                        anyhow!("--tiers: `{t}` is not a delay like 5s, 30s, 5m or 1h")
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let policy = RetryPolicy::tiers(delays);
            let mut all = vec![topic.clone()];
            all.extend(policy.tier_topics(&topic));
            all.push(dlq_topic(&topic));
            let wanted: Vec<(String, i32)> = all.iter().map(|t| (t.clone(), partitions)).collect();
            create_topics(config, &wanted).await?;
            if with_delays {
                let topics: Vec<(String, i32)> = delay_topics(&topic)
                    .into_iter()
                    .map(|t| (t, partitions))
                    .collect();
                let retention = CREATED_RETENTION.as_millis().to_string();
                create_topics_with(config, &topics, &[("retention.ms", &retention)]).await?;
                all.extend(topics.into_iter().map(|(t, _)| t));
            }
            if strict_order {
                let order = (order_topic(&topic), partitions);
                create_topics_with(
                    config,
                    std::slice::from_ref(&order),
                    &[("cleanup.policy", "compact")],
                )
                .await?;
                all.push(order.0);
            }
            // Visible to the next command (an `enqueue --in` right after).
            kjob::topics::wait_visible(config, &all).await?;
            for t in all {
                println!("{t}");
            }
            Ok(())
        }
    }
}

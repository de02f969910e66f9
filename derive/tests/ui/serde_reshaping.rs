use kjob_derive::Job;
use serde::Serialize;

#[derive(Serialize, Job)]
#[serde(rename_all = "camelCase")]
#[job(name = "orders.renamed", version = 1, key = order_id)]
struct Renamed {
    order_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

fn main() {}

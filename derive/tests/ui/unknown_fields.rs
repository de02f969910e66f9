use kjob_derive::Job;

#[derive(Job)]
#[job(name = "orders.confirmation", version = 1, key = id, tenant = shop)]
struct SendOrderConfirmation {
    order_id: String,
    tenant: Option<String>,
}

#[derive(Job)]
#[job(name = "orders.other", version = 1, key = order_id)]
struct OptionalKey {
    order_id: Option<String>,
}

fn main() {}

use kjob_derive::Job;

#[derive(Job)]
#[job(name = "orders confirmation", version = 0, key = order_id, queue = "x")]
struct SendOrderConfirmation {
    order_id: String,
}

#[derive(Job)]
#[job(name = "orders.enum", version = 1, key = id)]
enum NotARecord {
    A,
}

fn main() {}

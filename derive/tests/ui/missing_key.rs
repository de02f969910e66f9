use kjob_derive::Job;

#[derive(Job)]
#[job(name = "orders.confirmation", version = 1)]
struct SendOrderConfirmation {
    order_id: String,
}

fn main() {}

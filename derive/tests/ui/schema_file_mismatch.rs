use kjob_derive::Job;

// The file declares order_id: string, amount: long, currency: string.
#[derive(Job)]
#[job(
    name = "kjob.ui.order",
    version = 2,
    key = order_id,
    schema = "schemas/kjob.ui.order.v2.avsc"
)]
struct Order {
    order_id: String,
    amount: i32,
    legacy_ref: String,
}

// Named for v2, used for v3.
#[derive(Job)]
#[job(name = "kjob.ui.order", version = 3, key = order_id, schema = "schemas/kjob.ui.order.v2.avsc")]
struct OrderV3 {
    order_id: String,
    amount: i64,
    currency: String,
}

fn main() {}

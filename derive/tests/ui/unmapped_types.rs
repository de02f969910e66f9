use kjob_derive::Job;

struct Address {
    city: String,
}

#[derive(Job)]
#[job(name = "shipments", version = 1, key = id)]
struct Ship {
    id: String,
    address: Address,
    count: u64,
    #[job(default = 5)]
    label: String,
    #[job(default = "x")]
    note: Option<String>,
}

fn main() {}

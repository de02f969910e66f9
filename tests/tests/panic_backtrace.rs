//! A handler panic's backtrace travels with its dead letter
//! (`kjob-backtrace`, at most 8 KiB, naming the function that panicked),
//! a plain failure carries none, and the dashboard's detail page shows it
//! as text (a hostile header cannot become markup).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kjob::headers;
use kjob::{JobContext, JobError, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use rdkafka::message::{Header, Message, OwnedHeaders};

/// The function whose name the backtrace must show.
#[inline(never)]
fn charge_the_card(amount: i64) {
    if amount > 0 {
        panic!("test: the card service client broke");
    }
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_dead_letters_with_its_backtrace_shown_on_the_detail_page() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("bt");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(&topic, &TestJob::with("a", 1, "panic"))
        .await
        .expect("enqueue");
    producer
        .enqueue_to(&topic, &TestJob::with("b", 2, "permanent"))
        .await
        .expect("enqueue");
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |job: TestJob, _ctx: JobContext| async move {
            // After a suspension, so the panic happens on a later poll.
            tokio::task::yield_now().await;
            if job.behaviour == "panic" {
                charge_the_card(job.seq);
            }
            Err(JobError::not_found("test: gone"))
        })
        .build()
        .expect("worker");
    let running = start(w);
    eventually(Duration::from_secs(60), "two dead letters", || {
        WorkerStats::get(&running.stats.dead_lettered) == 2
    })
    .await;
    running.stop().await;

    let dlq = format!("{topic}.dlq");
    let letters = read_all(&config, &dlq);
    let of = |class: &str| {
        letters
            .iter()
            .find(|m| headers::find(m.headers(), headers::ERROR_CLASS) == Some(class))
            .unwrap_or_else(|| panic!("no {class} dead letter"))
    };
    let panicked = of("bug.panic");
    let bt = headers::find(panicked.headers(), kjob::dlq::BACKTRACE)
        .expect("a backtrace header on the panic's dead letter");
    assert!(bt.len() <= 8 * 1024, "{} bytes", bt.len());
    assert!(bt.contains("charge_the_card"), "{bt}");
    assert!(
        !bt.contains("rust_begin_unwind"),
        "the panic machinery's frames are left out: {bt}"
    );
    assert!(
        headers::find(of("permanent.not_found").headers(), kjob::dlq::BACKTRACE).is_none(),
        "a returned error has no backtrace"
    );

    // A hostile backtrace header, written by anyone who can produce.
    let hostile = OwnedHeaders::new()
        .insert(Header {
            key: "kjob-error-class",
            value: Some("bug.panic"),
        })
        .insert(Header {
            key: kjob::dlq::BACKTRACE,
            value: Some("  0: <script>window.pwned=1</script>\n"),
        });
    let (hp, ho) = producer
        .send_raw(&dlq, Some(b"k"), Some(b"x"), hostile)
        .await
        .expect("hostile record");

    let listen = format!(
        "127.0.0.1:{}",
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    );
    let _ui = Guard(
        Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
            .args(["ui", "--listen", &listen, "--no-discover"])
            .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
            .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
            .env_remove("KJOB_UI_TOKEN")
            .stdout(Stdio::null())
            .spawn()
            .expect("kjob ui"),
    );
    let base = format!("http://{listen}");
    let start = Instant::now();
    while reqwest::get(format!("{base}/assets/style.css"))
        .await
        .is_err()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "kjob ui did not answer"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let page = |at: String| {
        let url = format!("{base}/dlq/show?topic={topic}&at={at}");
        async move {
            reqwest::get(&url)
                .await
                .expect("GET")
                .text()
                .await
                .expect("body")
        }
    };
    let shown = page(format!("{}:{}", panicked.partition(), panicked.offset())).await;
    let section = shown
        .split("<pre class=\"backtrace\">")
        .nth(1)
        .expect("a backtrace section")
        .split("</pre>")
        .next()
        .unwrap_or_default();
    assert!(section.contains("charge_the_card"), "{section}");
    let shown = page(format!("{hp}:{ho}")).await;
    assert!(
        shown.contains("&lt;script&gt;window.pwned=1&lt;/script&gt;"),
        "escaped: {shown}"
    );
    assert!(!shown.contains("<script>window.pwned"), "never markup");
}

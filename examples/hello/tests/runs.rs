//! The quickstart keeps working: `cargo run -p kjob-example-hello` against
//! the local stack (`./dev test` starts it) enqueues its job, handles it
//! and exits 0 within a minute.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn hello_handles_its_job_and_exits() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kjob-example-hello"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the example");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("waiting").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("kjob-example-hello did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", out.status);
    assert!(stdout.contains("hello, world!"), "{stdout}");
}

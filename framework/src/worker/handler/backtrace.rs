//! The backtrace of a handler panic, for the dead letter's
//! [`kjob-backtrace`](crate::dlq::BACKTRACE) header.
//!
//! By the time `catch_unwind` returns, the stack that panicked is gone, so
//! the backtrace is taken where it still exists: in a panic hook, on the
//! panicking thread. A handler future is polled on one runtime thread at a
//! time and `catch_unwind` wraps that very poll, so the hook and the catch
//! run on the same thread, and a thread-local slot hands the text from one
//! to the other.
//!
//! The happy path pays two thread-local writes per poll of an attempt (a
//! depth counter that says "a handler is being polled here"); nothing is
//! captured unless something panics. The hook captures only inside an
//! attempt, so panics elsewhere in the process cost what they did before,
//! and it calls the hook that was installed before it, so the usual panic
//! message (and any application hook set earlier) is kept. A hook an
//! application sets *after* the worker started replaces this one: dead
//! letters then have no backtrace header, and nothing else changes.

use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::Once;

/// The most of a backtrace kept: enough for the frames that matter (the
/// handler's own, then the runtime's), bounded like every other header.
pub(crate) const MAX_BACKTRACE_BYTES: usize = 8 * 1024;

thread_local! {
    /// How many attempts are being polled on this thread (nested layers
    /// poll inside each other).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The backtrace of the last panic inside an attempt on this thread.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs the capturing panic hook once per process, in front of the
/// hook already there.
pub(crate) fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) > 0 {
                let text = render(&Backtrace::force_capture().to_string());
                LAST.with(|l| *l.borrow_mut() = Some(text));
            }
            previous(info);
        }));
    });
}

/// Decrements the depth when a poll ends, also when it unwinds.
struct Polling;

impl Polling {
    fn enter() -> Self {
        DEPTH.with(|d| d.set(d.get() + 1));
        Polling
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// `fut`, marked as an attempt for every poll, so a panic in it is
/// captured by the hook. Clears a stale capture first.
pub(crate) async fn traced<F: Future>(fut: F) -> F::Output {
    LAST.with(|l| l.borrow_mut().take());
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let _polling = Polling::enter();
        fut.as_mut().poll(cx)
    })
    .await
}

/// The backtrace of the panic just caught on this thread, if the hook took
/// one.
pub(crate) fn take() -> Option<String> {
    LAST.with(|l| l.borrow_mut().take())
}

/// A captured backtrace without the frames of the panic machinery and
/// this hook (everything up to the last `panicking` frame near the top),
/// cut to [`MAX_BACKTRACE_BYTES`] on a line boundary with a note of what
/// was left out.
pub(crate) fn render(full: &str) -> String {
    let lines: Vec<&str> = full.lines().collect();
    // Frames are "  N: symbol" lines, each followed by "at file:line".
    let is_frame = |l: &str| {
        l.trim_start()
            .split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    // The leading frames are this hook and the panic machinery, down to
    // `rust_begin_unwind` (or `begin_panic`) and the `core::panicking`
    // frames right below it; the next frame is the code that panicked.
    let symbol = |l: &str| {
        l.trim_start()
            .split_once(':')
            .map_or("", |(_, s)| s.trim())
            .to_string()
    };
    let frames: Vec<(usize, String)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| is_frame(l))
        .map(|(i, l)| (i, symbol(l)))
        .collect();
    let begin = frames
        .iter()
        .position(|(_, s)| s.contains("rust_begin_unwind") || s.contains("begin_panic"));
    let last_machinery = begin.map(|b| {
        let mut k = b;
        while frames.get(k + 1).is_some_and(|(_, s)| {
            s.contains("core::panicking::")
                || s.contains("std::panicking::")
                || s.contains("panic_fmt")
        }) {
            k += 1;
        }
        frames[k].0
    });
    let skip = last_machinery.map_or(0, |i| {
        // Past the frame and its "at" line.
        let mut j = i + 1;
        while j < lines.len() && !is_frame(lines[j]) {
            j += 1;
        }
        j
    });
    let mut out = String::new();
    let mut left_out = 0usize;
    for l in &lines[skip..] {
        if left_out > 0 || out.len() + l.len() + 1 > MAX_BACKTRACE_BYTES - 64 {
            left_out += 1;
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    if left_out > 0 {
        out.push_str(&format!("… {left_out} more line(s) left out\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use std::panic::AssertUnwindSafe;

    #[inline(never)]
    fn deep_in_the_handler() {
        panic!("the handler broke");
    }

    #[tokio::test]
    async fn a_panic_in_an_attempt_leaves_its_backtrace_and_others_do_not() {
        install_hook();
        let caught = AssertUnwindSafe(traced(async {
            tokio::task::yield_now().await;
            deep_in_the_handler();
        }))
        .catch_unwind()
        .await;
        assert!(caught.is_err());
        let bt = take().expect("a backtrace");
        assert!(bt.len() <= MAX_BACKTRACE_BYTES);
        assert!(bt.contains("deep_in_the_handler"), "{bt}");
        assert!(
            !bt.contains("rust_begin_unwind"),
            "machinery frames cut: {bt}"
        );
        assert!(take().is_none(), "taken once");
        // Outside an attempt, nothing is captured.
        let outside = std::panic::catch_unwind(|| panic!("elsewhere"));
        assert!(outside.is_err());
        assert!(take().is_none());
        // And the happy path leaves nothing behind.
        assert_eq!(traced(async { 7 }).await, 7);
        assert!(take().is_none());
        assert_eq!(DEPTH.with(Cell::get), 0, "the depth unwinds too");
    }

    #[test]
    fn long_backtraces_are_cut_on_a_line() {
        let full: String = (0..2000)
            .map(|i| format!("  {i}: frame_{i}\n             at src/x.rs:{i}:1\n"))
            .collect();
        let r = render(&full);
        assert!(r.len() <= MAX_BACKTRACE_BYTES, "{}", r.len());
        assert!(r.starts_with("  0: frame_0\n"));
        assert!(
            r.ends_with("more line(s) left out\n"),
            "{}",
            &r[r.len() - 80..]
        );
        let with_machinery = "  0: std::backtrace::Backtrace::force_capture\n      at a\n  1: {closure#0}\n  2: __rustc::rust_begin_unwind\n      at b\n  3: core::panicking::panic_fmt\n  4: my_handler\n      at c\n  5: std::panicking::try\n";
        assert_eq!(
            render(with_machinery),
            "  4: my_handler\n      at c\n  5: std::panicking::try\n"
        );
    }
}

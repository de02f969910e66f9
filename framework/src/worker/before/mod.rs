//! Before the handler: step 6 in ARCHITECTURE.md.
//!
//! **Enters:** a record whose attempt the pipeline started, with its route
//! and its topic's role. **Leaves:** the record cleared for its handler,
//! or ended before it:
//!
//! * `stages`: a delayed job or a retry not due yet hops on to its next
//!   bucket or tier; a main-topic job enqueued due too soon for a bucket
//!   waits out its run time;
//! * `debounce`: of several waiting jobs with one key, only the newest runs;
//! * `strict`: on a strict-order route, a key's later jobs wait behind its
//!   job in the retry path;
//! * `park`: a wait for a downstream (the registry, a breaker, a rate
//!   limit) gives the handler slot back until it can go on.

pub(in crate::worker) mod debounce;
pub(crate) mod park;
pub(in crate::worker) mod stages;
pub(crate) mod strict;

//! Dispatch: step 5 in ARCHITECTURE.md.
//!
//! **Enters:** the `Run` tickets the scheduler grants, and the completions
//! of finished attempts. **Leaves:** each job's attempt started on a
//! dispatcher task (`dispatcher`), its completion given back to the
//! scheduler behind the one lock (`hub`), which starts what it releases and
//! wakes the poll thread when it leaves a consumer action.

pub(in crate::worker) mod dispatcher;
pub(in crate::worker) mod hub;

//! The passes' copy of the free pool ([`PassPool`]).

use crate::alloc::Free;

/// A copy of the cluster's free pool kept equal to it, which a scheduling pass takes, works on with its changes
/// logged, rolls back and hands back ([`crate::alloc::Free::rollback`]): a pass then costs no copy of the free
/// resources of every node (on 10,000 nodes, most of a pass that starts a few jobs). Every take and give on the
/// cluster's pool is made on the copy too; other changes to the pool (a node added, or made schedulable or not)
/// drop the copy, and the next pass copies the pool again. Empty while a pass holds it (a pass running at the same
/// time, on another thread, copies the pool), in a cloned state, and after a pass that panicked.
#[derive(Default)]
pub(crate) struct PassPool(std::sync::Mutex<Option<Free>>);

impl PassPool {
    /// The copy, if one is kept and no pass holds it.
    pub(crate) fn take(&self) -> Option<Free> {
        self.0.try_lock().ok().and_then(|mut g| g.take())
    }

    /// Keeps `free`, which must equal the cluster's pool.
    pub(crate) fn put(&self, free: Free) {
        if let Ok(mut g) = self.0.try_lock() {
            *g = Some(free);
        }
    }

    /// Makes a change to the copy, if one is kept.
    pub(super) fn apply(&mut self, f: impl FnOnce(&mut Free)) {
        if let Some(copy) = self.0.get_mut().ok().and_then(|c| c.as_mut()) {
            f(copy);
        }
    }

    /// Drops the copy.
    pub(super) fn drop_copy(&mut self) {
        if let Ok(c) = self.0.get_mut() {
            *c = None;
        }
    }

    /// Whether the copy, when one is kept, equals `free` (for [`ClusterState::check_invariants`]).
    pub(super) fn agrees_with(&self, free: &Free) -> bool {
        self.0.try_lock().ok().is_none_or(|g| g.as_ref().is_none_or(|c| c.same_as(free)))
    }
}

/// A cloned state starts without a copy.
impl Clone for PassPool {
    fn clone(&self) -> Self {
        PassPool::default()
    }
}

impl std::fmt::Debug for PassPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassPool")
    }
}

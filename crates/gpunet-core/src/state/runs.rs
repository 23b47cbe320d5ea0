//! The running jobs as a victim search reads them: a compact row per running job ([`RunRow`], in
//! `ClusterState::run_rows`), a brief of it beside its key in each tenant's index ([`RunBrief`], in
//! `ClusterState::tenant_runs`), and what it would lose if evicted ([`LostWork`]). `ClusterState` keeps them as jobs
//! start, checkpoint, begin an eviction and end (`occupy`, `release`, `record_checkpoint`, `begin_eviction`).

use crate::ids::{JobId, NodeId, TenantId};
use crate::units::Time;

/// A running job's task placements as the running index keeps them (one task inline).
pub(crate) type RunningTasks = smallvec::SmallVec<[crate::job::TaskPlacement; 1]>;

/// What victim selection needs of a running job, kept compact for a linear scan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunRow {
    pub(crate) id: JobId,
    pub(crate) tenant: TenantId,
    pub(crate) priority: i32,
    pub(crate) started: Time,
    pub(crate) borrowed: bool,
    pub(crate) preemptible: bool,
    pub(crate) evicting: bool,
    pub(crate) gpus: u32,
    pub(crate) ckpt_interval: u64,
    /// Last reported checkpoint; `Time::MAX` when none.
    pub(crate) last_ckpt: Time,
    pub(crate) attained_before: u64,
    /// Estimated end (`Time::MAX` without estimate), for preemptive SRTF.
    pub(crate) est_end: Time,
    /// The job's SJF key (estimate ÷ GPUs in ms; `u64::MAX` without estimate), for preemptive SJF.
    pub(crate) sjf_key: u64,
    /// A learned estimate's run time (`None` for an estimate given as exact, or none) and the progress kept when
    /// the attempt started (ms): the job's Gittins rank as a victim under preemptive SRTF/SRGF.
    pub(crate) learned: Option<crate::gittins::LogNormal>,
    pub(crate) progress: u64,
    /// How far the job is known to run ([`Job::known`], ms).
    pub(crate) known: u64,
    /// Bit per node class the job's tasks touch (all bits for class indexes >= 64).
    pub(crate) classes: u64,
    /// The node, when every task of the job is on one (victims for a one-node job are also looked for per node).
    pub(crate) node: Option<NodeId>,
}

impl RunRow {
    /// The row's key in `ClusterState::tenant_runs`: tenant, priority, start, job.
    pub(super) fn tenant_key(&self) -> (TenantId, i32, Time, JobId) {
        (self.tenant, self.priority, self.started, self.id)
    }

    /// What it would lose if evicted.
    pub(crate) fn lost(&self) -> LostWork {
        LostWork {
            started: self.started,
            last_ckpt: self.last_ckpt,
            ckpt_interval: self.ckpt_interval,
            gpus: self.gpus,
        }
    }
}

/// What a quota-held victim search (`schedule::preempt`) reads of a running job in `tenant_runs`, next to its key,
/// before (and mostly instead of) its row: its row's place in `run_rows`, and copies of the row's fields that say
/// whether it is no candidate at all, or not yet one under LAS, and, for a candidate, where it runs, what work it
/// would lose ([`LostWork`]) and its estimated end. A search that needs nothing else of the row (by priority or LAS,
/// or shorter-first under SRTF or SRGF ranking by medians) makes its candidates from briefs alone, reading no row:
/// the tenant's rows, spread over `run_rows`, were most of a cold search's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunBrief {
    /// The row's place: part and index (`u32`s, to keep the brief small; see [`RunBrief::place`]).
    part: u32,
    index: u32,
    pub(crate) classes: u64,
    pub(crate) attained_before: u64,
    pub(crate) gpus: u32,
    pub(crate) preemptible: bool,
    pub(crate) evicting: bool,
    pub(crate) node: Option<NodeId>,
    pub(crate) last_ckpt: Time,
    pub(crate) ckpt_interval: u64,
    /// The row's estimated end (`Time::MAX` without estimate): a search under preemptive SRTF or SRGF that ranks
    /// learned estimates by their median works out the row's key from it.
    pub(crate) est_end: Time,
}

impl RunBrief {
    pub(super) fn of(r: &RunRow, place: (usize, usize)) -> RunBrief {
        RunBrief {
            part: place.0 as u32,
            index: place.1 as u32,
            classes: r.classes,
            attained_before: r.attained_before,
            gpus: r.gpus,
            preemptible: r.preemptible,
            evicting: r.evicting,
            node: r.node,
            last_ckpt: r.last_ckpt,
            ckpt_interval: r.ckpt_interval,
            est_end: r.est_end,
        }
    }

    /// What the job would lose if evicted, its start being `started` (the brief's key holds it; as [`RunRow::lost`]).
    pub(crate) fn lost(&self, started: Time) -> LostWork {
        LostWork { started, last_ckpt: self.last_ckpt, ckpt_interval: self.ckpt_interval, gpus: self.gpus }
    }

    /// The row's place in `run_rows`.
    pub(crate) fn place(&self) -> (usize, usize) {
        (self.part as usize, self.index as usize)
    }

    pub(super) fn set_place(&mut self, (part, index): (usize, usize)) {
        (self.part, self.index) = (part as u32, index as u32);
    }
}

/// What a running job would lose if evicted, as a victim search ranks it: its start, last checkpoint, checkpoint
/// interval and GPUs, from its row or its brief.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LostWork {
    pub(crate) started: Time,
    pub(crate) last_ckpt: Time,
    pub(crate) ckpt_interval: u64,
    pub(crate) gpus: u32,
}

impl LostWork {
    /// GPU-ms lost if evicted at `now` (same rule as [`Job::lost_work_if_evicted`]).
    pub(crate) fn at(&self, now: Time) -> u64 {
        let ck = match (self.last_ckpt, self.ckpt_interval) {
            (t, _) if t != Time::MAX => t,
            (_, iv) if iv > 0 => self.started + crate::units::Dur(now.since(self.started).0 / iv * iv),
            _ => self.started,
        };
        now.since(ck).0.saturating_mul(self.gpus.max(1) as u64)
    }

    /// How fast the loss grows between checkpoints: GPU-ms per ms, its GPUs (at least 1).
    pub(crate) fn rate(&self) -> u64 {
        self.gpus.max(1) as u64
    }

    /// The first time after `now` at which the loss stops growing as one line by time alone: the next checkpoint of
    /// its interval (none with a reported checkpoint, whose next report is an event of its own, or without an
    /// interval), or, counted from a checkpoint or start later than `now` (nothing lost until then), that time.
    pub(crate) fn resets_after(&self, now: Time) -> Time {
        let from = if self.last_ckpt != Time::MAX { self.last_ckpt } else { self.started };
        if from > now {
            return from;
        }
        if self.last_ckpt != Time::MAX || self.ckpt_interval == 0 {
            return Time::MAX;
        }
        let iv = self.ckpt_interval;
        let next = (now.since(self.started).0 / iv).saturating_add(1).saturating_mul(iv);
        Time(self.started.0.saturating_add(next))
    }
}

/// When time alone may first change an order of items by a loss that grows as a line, `(loss now, rate, next reset)`
/// in that order (ascending by loss, ties by anything fixed): the earliest time two neighbours in it meet (the first
/// change of an order of lines is between neighbours), or one's loss drops to nothing at a checkpoint. `now` when two
/// meet already.
pub(crate) fn order_turns_at(now: Time, items: impl Iterator<Item = (u64, u64, Time)>) -> Time {
    let mut turn = Time::MAX;
    let mut prev: Option<(u64, u64)> = None;
    for (lost, rate, reset) in items {
        turn = turn.min(reset);
        if let Some((pl, pr)) = prev {
            debug_assert!(pl <= lost, "in ascending order of loss");
            if pr > rate {
                turn = turn.min(Time(now.0.saturating_add((lost - pl) / (pr - rate))));
            }
        }
        prev = Some((lost, rate));
    }
    turn.max(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: two lines 200 GPU-ms apart, the first growing 3 GPU-ms per ms faster, meet 66 ms on (rounded down);
    /// lines that grow alike, or the later one faster, never do; a checkpoint due earlier comes first; lines that
    /// meet already turn at once.
    #[test]
    fn an_order_of_losses_turns_when_neighbours_meet_or_one_checkpoints() {
        let now = Time(1_000);
        assert_eq!(order_turns_at(now, [(100, 4, Time::MAX), (300, 1, Time::MAX)].into_iter()), Time(1_066));
        assert_eq!(
            order_turns_at(now, [(100, 2, Time::MAX), (300, 2, Time::MAX), (900, 8, Time::MAX)].into_iter()),
            Time::MAX
        );
        assert_eq!(order_turns_at(now, [(100, 4, Time(1_050)), (300, 1, Time::MAX)].into_iter()), Time(1_050));
        assert_eq!(order_turns_at(now, [(300, 4, Time::MAX), (300, 1, Time::MAX)].into_iter()), now);
        // Neighbours: the first meets the second 62 ms on, before the second meets the third (100) or the first the
        // third (66).
        assert_eq!(
            order_turns_at(now, [(0, 9, Time::MAX), (500, 1, Time::MAX), (600, 0, Time::MAX)].into_iter()),
            Time(1_062)
        );
    }

    /// A loss with an interval drops to nothing at the next multiple of it from the start; one with a reported
    /// checkpoint, or no interval, by time alone never; one counted from a checkpoint after `now` starts there.
    #[test]
    fn a_loss_resets_at_its_next_interval_checkpoint() {
        let l = LostWork { started: Time(1_000), last_ckpt: Time::MAX, ckpt_interval: 600, gpus: 2 };
        assert_eq!(l.resets_after(Time(1_000)), Time(1_600));
        assert_eq!(l.resets_after(Time(1_599)), Time(1_600));
        assert_eq!(l.resets_after(Time(1_600)), Time(2_200));
        assert_eq!(l.at(Time(1_599)), 599 * 2);
        assert_eq!(l.at(Time(1_600)), 0);
        assert_eq!(l.rate(), 2);
        assert_eq!(LostWork { last_ckpt: Time(1_200), ..l }.resets_after(Time(1_300)), Time::MAX);
        assert_eq!(LostWork { ckpt_interval: 0, ..l }.resets_after(Time(1_300)), Time::MAX);
        // A checkpoint dated after `now`: nothing lost until then, and the line starts there.
        assert_eq!(LostWork { last_ckpt: Time(1_500), ..l }.resets_after(Time(1_300)), Time(1_500));
        assert_eq!(LostWork { last_ckpt: Time(1_500), ..l }.at(Time(1_300)), 0);
    }
}

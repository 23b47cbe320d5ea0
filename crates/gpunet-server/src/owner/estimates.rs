//! Learned run-time estimates, live: the owner's [`Predictors`] learn from every job that succeeds (and, at start,
//! from the succeeded jobs in the store), and a job submitted without an estimate gets the predicted one — the
//! scheduler then uses it as it would a given one (SJF/SRTF order, backfill, ETAs) — recorded in the job's document
//! so that `show` and `why` say it was learned, from what, and how sure it is.
//!
//! Each tenant has a predictor of its own, learning from its jobs only: an estimate (in `show`, or a dry run's, which
//! anyone may ask for with any name and GPU count) says nothing of another tenant's runs — not how long they took,
//! nor how many there were — and one tenant's many runs neither crowd out nor skew another's. (A start time is
//! another matter: the ETA replays the whole cluster, so it depends on when other tenants' running jobs are expected
//! to end, as a place in the queue depends on their jobs.) Each level of each predictor holds at most
//! [`Predictor::MAX_KEYS`] keys, so the memory of all of them grows with the number of tenants (only an admin
//! creates one).

use super::{JobDoc, Owner};
use gpunet_api::types::EstimateView;
use gpunet_core::{Dur, Job, JobKey, JobSpec, Prediction, Predictor, Time};

/// Who a job belongs to for learning: its submitting user, else its tenant.
fn user_of<'a>(submitted_by: Option<&'a str>, tenant: &'a str) -> &'a str {
    submitted_by.unwrap_or(tenant)
}

fn key<'a>(spec: &'a JobSpec, user: &'a str) -> JobKey<'a> {
    JobKey { user, name: &spec.name, gpus: spec.total_gpus() }
}

/// One [`Predictor`] per tenant, by the tenant's name.
#[derive(Debug, Default)]
pub(crate) struct Predictors(std::collections::HashMap<String, Predictor>);

impl Predictors {
    /// The estimate for a job like `key` of `tenant`, from that tenant's runs only.
    fn predict(&self, tenant: &str, key: JobKey<'_>) -> Option<Prediction> {
        self.0.get(tenant)?.predict(key)
    }

    /// Learns that a job like `key` of `tenant` ran for `ran`.
    fn observe(&mut self, tenant: &str, key: JobKey<'_>, ran: Dur) {
        match self.0.get_mut(tenant) {
            Some(p) => p.observe(key, ran),
            None => self.0.entry(tenant.to_string()).or_default().observe(key, ran),
        }
    }
}

/// The run time of a succeeded job: the work kept from earlier attempts plus its last attempt.
fn ran(job: &Job, doc: &JobDoc, ended_ms: u64) -> Option<Dur> {
    let run = job.run.as_deref().or(doc.more().last_run.as_ref())?;
    Some(Dur(job.progress.0 + ended_ms.checked_sub(run.started.0)?))
}

impl Owner {
    /// Gives a job without an estimate the predicted one; returns the prediction used. An array's is its elements'
    /// (they are learned from like any job, under the array's name and GPU count), which they carry in their
    /// documents (`owner/arrays.rs`): without it, under SRTF/SRGF (and `auto`) an array would queue behind every job
    /// with an estimate.
    pub(crate) fn learned_estimate(
        predictors: &Predictors,
        spec: &mut JobSpec,
        user: Option<&str>,
        tenant: &str,
    ) -> Option<Prediction> {
        if spec.estimated_duration.is_some() {
            return None;
        }
        let p = predictors.predict(tenant, key(spec, user_of(user, tenant)))?;
        spec.estimated_duration = Some(p.duration);
        spec.estimate_spread = p.spread.map(|s| s as f32);
        Some(p)
    }

    /// A job and its document before its successful end was confirmed at `ended_ms`: its run is learned.
    pub(crate) fn learn_success(&mut self, job: &Job, before: &JobDoc, ended_ms: u64) {
        if let Some(d) = ran(job, before, ended_ms) {
            let user = user_of(before.submitted_by.as_deref().map(String::as_str), &before.tenant);
            self.predictors.observe(&before.tenant, key(&job.spec, user), d);
        }
    }

    /// At start: learns from the succeeded jobs in the store, in the order they ended.
    pub(crate) fn relearn(&mut self) {
        let mut done: Vec<(u64, &Job, &JobDoc)> = self
            .docs
            .iter()
            .filter_map(|(id, d)| Some((d.job(&self.st, *id)?, d)))
            .filter(|(j, _)| j.state == gpunet_core::JobState::Succeeded)
            .filter_map(|(j, d)| j.finished.map(|f| (f.0, j, d)))
            .collect();
        done.sort_by_key(|(f, j, _)| (*f, j.id));
        let mut p = Predictors::default();
        for (f, j, d) in done {
            if let Some(r) = ran(j, d, f) {
                p.observe(
                    &d.tenant,
                    key(&j.spec, user_of(d.submitted_by.as_deref().map(String::as_str), &d.tenant)),
                    r,
                );
            }
        }
        self.predictors = p;
    }

    /// The estimate the scheduler uses for a job, given or learned.
    pub(crate) fn estimate_view(&self, job: &Job, doc: &JobDoc) -> Option<EstimateView> {
        estimate_view(job, doc.more().learned_estimate.as_ref(), Time(crate::now_ms()))
    }
}

/// The estimate the scheduler uses for `job` at `now`: learned (`learned`, the prediction it was given), given, or
/// its probe when it has neither.
pub(crate) fn estimate_view(job: &Job, learned: Option<&Prediction>, now: Time) -> Option<EstimateView> {
    let in_probe = |p: Dur| job.in_probe(now).then_some(p.0.div_ceil(1000));
    let Some(d) = job.spec.estimated_duration else {
        // No estimate, given or learned: ranked by its probe, when it was submitted under one.
        let p = job.spec.probe()?;
        return Some(EstimateView {
            seconds: p.0.div_ceil(1000),
            source: "probe".into(),
            confidence: None,
            basis: None,
            samples: None,
            spread: None,
            probe_s: in_probe(p),
        });
    };
    Some(match learned {
        Some(p) => EstimateView {
            seconds: d.0.div_ceil(1000),
            source: "learned".into(),
            confidence: Some((p.confidence * 100.0).round() / 100.0),
            // "all runs": of the job's tenant (one predictor per tenant; before, of every tenant, as a prediction
            // stored then still says).
            basis: Some(p.basis.describe().into()),
            samples: Some(p.samples),
            spread: p.spread.map(|s| (s * 100.0).round() / 100.0),
            probe_s: job.spec.probe().and_then(in_probe),
        },
        None => EstimateView {
            seconds: d.0.div_ceil(1000),
            source: "given".into(),
            confidence: None,
            basis: None,
            samples: None,
            spread: None,
            probe_s: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunet_core::TenantId;

    #[test]
    fn a_job_without_estimate_gets_the_learned_one_and_a_given_one_is_kept() {
        let mut p = Predictors::default();
        assert!(Owner::learned_estimate(&p, &mut JobSpec::new(TenantId(0), "train", 2, 1), Some("ana"), "t").is_none());
        for s in [590, 600, 610] {
            p.observe("t", JobKey { user: "ana", name: "train", gpus: 2 }, Dur::from_secs(s));
        }
        let mut spec = JobSpec::new(TenantId(0), "train", 2, 1);
        let got = Owner::learned_estimate(&p, &mut spec, Some("ana"), "t").unwrap();
        assert_eq!(got.basis, gpunet_core::Basis::UserNameGpus);
        assert_eq!(spec.estimated_duration, Some(got.duration));
        // Its spread goes with it: the scheduler ranks the job by the log-normal it describes.
        let spread = got.spread.unwrap();
        assert!(spread > 0.0 && spread < 0.05, "{spread}");
        assert_eq!(spec.estimate_spread, Some(spread as f32));
        assert!((got.duration.0 as f64 / 600_000.0 - 1.0).abs() < 0.1, "{:?}", got.duration);
        // Another user's job of the same name learns only from all runs.
        let mut other = JobSpec::new(TenantId(0), "train", 2, 1);
        assert_eq!(Owner::learned_estimate(&p, &mut other, Some("bo"), "t").unwrap().basis, gpunet_core::Basis::All);
        let mut given = JobSpec::new(TenantId(0), "train", 2, 1).estimate(Dur::from_secs(5));
        assert!(Owner::learned_estimate(&p, &mut given, Some("ana"), "t").is_none());
        assert_eq!(given.estimated_duration, Some(Dur::from_secs(5)));
        // Another tenant learns nothing from these runs, not even from its user of the same name.
        let mut elsewhere = JobSpec::new(TenantId(1), "train", 2, 1);
        assert!(Owner::learned_estimate(&p, &mut elsewhere, Some("ana"), "u").is_none());
        assert_eq!(elsewhere.estimated_duration, None);
        // Its own runs are its own: the first tenant's estimate does not move.
        p.observe("u", JobKey { user: "ana", name: "train", gpus: 2 }, Dur::from_secs(60_000));
        let mut again = JobSpec::new(TenantId(0), "train", 2, 1);
        assert_eq!(Owner::learned_estimate(&p, &mut again, Some("ana"), "t"), Some(got));
        let mut there = JobSpec::new(TenantId(1), "train", 2, 1);
        let theirs = Owner::learned_estimate(&p, &mut there, Some("ana"), "u").unwrap();
        assert!((theirs.duration.0 as f64 / 60_000_000.0 - 1.0).abs() < 0.01, "{:?}", theirs.duration);
    }
}

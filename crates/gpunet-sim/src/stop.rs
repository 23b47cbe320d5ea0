//! How long a stop takes in simulation: from asking a preempted or drained job to stop until its processes are gone
//! (its SIGTERM handler writing a checkpoint). The victim's GPUs stay held meanwhile, as live. By default each stop
//! draws one of the times measured on real processes (`data/stop-times/checkpoint-on-sigterm.csv`, see its README),
//! never longer than the agent's grace period before SIGKILL ([`gpunet_core::lifecycle::STOP_GRACE`]).

use crate::error::SimError;
use crate::rng::Rng;
use gpunet_core::lifecycle::STOP_GRACE;
use gpunet_core::Dur;
use serde::Serialize;

const MEASURED: &str = include_str!("../../../data/stop-times/checkpoint-on-sigterm.csv");

/// The stop-time model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StopTime {
    /// Every stop takes this long (`--stop-time-s`).
    Fixed(Dur),
    /// Each stop takes one of these measured times, drawn uniformly from a stream of its own (so the other random
    /// draws of a seeded run do not move), at most [`STOP_GRACE`] (`--stop-times FILE`; the default).
    Measured(Vec<Dur>),
}

impl Default for StopTime {
    fn default() -> StopTime {
        StopTime::from_csv("data/stop-times/checkpoint-on-sigterm.csv", MEASURED).expect("the shipped stop times parse")
    }
}

impl StopTime {
    /// Reads a CSV with a header and a `seconds` column (other columns are ignored), one row per measured stop.
    pub fn from_csv(name: &str, text: &str) -> Result<StopTime, SimError> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let (_, header) = lines.next().ok_or_else(|| SimError::invalid(name, "empty: expected a header"))?;
        let col = header
            .split(',')
            .position(|c| c.trim() == "seconds")
            .ok_or_else(|| SimError::invalid(name, "no `seconds` column in the header"))?;
        let mut v = Vec::new();
        for (i, line) in lines {
            let at = format!("{name}:{}", i + 1);
            let cell = line.split(',').nth(col).ok_or_else(|| SimError::invalid(&at, "no `seconds` value"))?;
            let s: f64 = cell.trim().parse().map_err(|_| SimError::invalid(&at, format!("seconds {cell:?}")))?;
            if !s.is_finite() || !(0.0..=86_400.0).contains(&s) {
                return Err(SimError::invalid(&at, format!("seconds {s}: allowed are 0 to 86400")));
            }
            v.push(Dur((s * 1000.0).round() as u64));
            if v.len() > 1_000_000 {
                return Err(SimError::invalid(name, "more than 1000000 rows"));
            }
        }
        if v.is_empty() {
            return Err(SimError::invalid(name, "no rows"));
        }
        Ok(StopTime::Measured(v))
    }

    /// One stop's duration.
    pub fn draw(&self, rng: &mut Rng) -> Dur {
        match self {
            StopTime::Fixed(d) => *d,
            StopTime::Measured(v) => v[rng.below(v.len() as u64) as usize].min(STOP_GRACE),
        }
    }

    /// Whether every stop is instant (victims release their GPUs at the decision).
    pub fn is_instant(&self) -> bool {
        match self {
            StopTime::Fixed(d) => d.0 == 0,
            StopTime::Measured(v) => v.iter().all(|d| d.0 == 0),
        }
    }

    /// The mean stop, for reports.
    pub fn mean(&self) -> Dur {
        match self {
            StopTime::Fixed(d) => *d,
            StopTime::Measured(v) => Dur(v.iter().map(|d| d.min(&STOP_GRACE).0).sum::<u64>() / v.len() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_measurements_load_and_stay_within_the_grace_period() {
        let st = StopTime::default();
        let StopTime::Measured(v) = &st else { panic!("{st:?}") };
        assert!(v.len() >= 20, "{} rows", v.len());
        let mut rng = Rng::new(7);
        let draws: Vec<Dur> = (0..1000).map(|_| st.draw(&mut rng)).collect();
        assert!(draws.iter().all(|d| *d <= STOP_GRACE));
        let distinct: std::collections::BTreeSet<u64> = draws.iter().map(|d| d.0).collect();
        assert!(distinct.len() > 10, "draws cover the measurements: {distinct:?}");
        assert!(st.mean() > Dur(0) && st.mean() < STOP_GRACE, "{:?}", st.mean());
    }

    #[test]
    fn a_measurement_longer_than_the_grace_period_is_cut_to_it() {
        let st = StopTime::from_csv("t", "model,seconds\nhuge,600\n").unwrap();
        assert_eq!(st.draw(&mut Rng::new(1)), STOP_GRACE);
        assert_eq!(StopTime::Fixed(Dur(600_000)).draw(&mut Rng::new(1)), Dur(600_000), "a fixed time is as given");
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        for (text, want) in [
            ("", "empty"),
            ("model,secs\na,1\n", "no `seconds` column"),
            ("seconds\n", "no rows"),
            ("seconds\n1\nx\n", "t:3"),
            ("seconds\n-1\n", "allowed are 0 to 86400"),
            ("seconds\nNaN\n", "allowed are 0 to 86400"),
            ("a,seconds\n1\n", "t:2"),
        ] {
            let e = StopTime::from_csv("t", text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}

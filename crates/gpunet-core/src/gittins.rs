//! Gittins ranks: how to order jobs whose run time is known only as a distribution.
//!
//! A learned estimate is not a run time but a guess with a spread: the predictor ([`crate::Predictor`]) keeps the
//! mean `μ` and the spread `σ` of the log of run times of jobs like this one. Taking the run time `D` as log-normal
//! with those parameters, the order that minimises the mean time in system of a single server without knowing sizes
//! is the Gittins index policy (Gittins 1989; Aalto, Ayesta and Righter 2009; Tiresias's 2D-Gittins uses it for GPU
//! jobs): serve the job with the highest index, where for a job that has received `a` of service
//!
//! ```text
//! index(a) = sup_{b > a}  P(D ≤ b | D > a) / E[min(D, b) − a | D > a]
//! ```
//!
//! This module returns its inverse, the **rank**, in units of time: `rank(a) = inf_{b>a} ∫_a^b S(x) dx / (S(a) −
//! S(b))` with `S` the survival function. For a job whose run time is known exactly the rank is its remaining time,
//! so ranks and remaining times are ordered together: SRTF on ranks is SRPT for known jobs and the Gittins policy for
//! learned ones. A young job of a class with a wide spread ranks by its chance of ending soon; with a wide spread
//! (about 1.5 and more), one that has outlived most of its class ranks behind (it is likely one of the long ones),
//! which is what attained-service policies (LAS) exploit, here weighed by the class's own distribution. With a
//! narrow spread the log-normal's rank falls again past the median; [`LogNormal::rank`] then ranks a job at no less
//! than the time it has run.
//!
//! Computation: `∫ S` has a closed form for the log-normal (`E[min(D, t)] = e^{σ²/2} Φ(ln t/σ − σ) + t Q(ln t/σ)`).
//! For each spread (quantised to [`SIGMA_STEP`]) a row of ranks of the unit log-normal over `z = ln(a)/σ` on a grid
//! is computed once, on first use, and looked up by linear interpolation; beyond the grid's end the rank grows in
//! proportion to the attained time. With the row come, per octave of attained time over the median, an upper bound on
//! the rank and a bound on how fast it can move from there on ([`LogNormal::quick_bounds`]): a victim search settles
//! most running jobs, those ranked well under its bound, and when they may reach it, without a logarithm. Pure and
//! deterministic.

use crate::units::Dur;
use std::sync::OnceLock;

/// Spreads are quantised to multiples of this.
pub const SIGMA_STEP: f64 = 0.05;
/// Spreads below half a step are taken as exact estimates; above this they are clamped. (A wider spread would rank a
/// new job at almost nothing — about 2·10⁻⁷ of its median at 6 — and a tenant could train the predictor into one with
/// runs of a millisecond and of hours; at 3 a new job ranks at 0.087 of its median.)
pub const SIGMA_MAX: f64 = 3.0;
const ROWS: usize = (SIGMA_MAX / SIGMA_STEP) as usize + 1;
const Z_MIN: f64 = -8.0;
const Z_MAX: f64 = 8.0;
const Z_STEP: f64 = 0.025;
const Z_POINTS: usize = ((Z_MAX - Z_MIN) / Z_STEP) as usize + 1;
/// The most a rank is (ms; about 31,700 years): below 2^52, where `r + 0.5` truncated rounds an `f64` rank.
const RANK_CAP: u64 = 1_000_000_000_000_000;
/// How far above `a` (in units of `σ` on the log scale) the search for `b` looks, besides `b = ∞`.
const B_REACH: f64 = 12.0;
const B_POINTS: usize = (B_REACH / Z_STEP) as usize;

/// A spread's row of ranks on the grid, and for each octave of attained time over the median bounds on the rank
/// there and on how fast it can move from there on ([`LogNormal::quick_bounds`]).
struct Row {
    ranks: Box<[f64]>,
    /// By `d + OCTAVES` for attained times `a` with `2^(d−1) < a ÷ median < 2^(d+1)` ([`Octave`]). Index 0: no
    /// attained time yet.
    octaves: Box<[Octave]>,
    /// `1/σ`, and the attained time (in medians) where the grid starts, `e^{σ Z_MIN}`.
    inv_sigma: f64,
    grid_start: f64,
}

/// What a row says of the rank over an octave of attained time (in units of the median): the most and the least it
/// is there, and the most it can change per unit of attained time at any attained time from the octave's start on.
#[derive(Debug, Clone, Copy, Default)]
struct Octave {
    most: f64,
    least: f64,
    slope: f64,
}

/// Octaves of attained time over the median each side of it that [`Row::octaves`] covers: attained times and medians
/// are whole milliseconds below 2^64.
const OCTAVES: i32 = 64;

static TABLE: [OnceLock<Row>; ROWS] = [const { OnceLock::new() }; ROWS];

/// `Q(x) = P(N(0,1) > x)`, accurate in the tails.
fn q(x: f64) -> f64 {
    0.5 * libm::erfc(x / std::f64::consts::SQRT_2)
}

/// The ranks of the log-normal with median 1 and spread `sigma` at `z = Z_MIN + i·Z_STEP` (attained `e^{σz}`).
fn row(sigma: f64) -> Box<[f64]> {
    let n = Z_POINTS + B_POINTS;
    let z = |i: usize| Z_MIN + i as f64 * Z_STEP;
    // Survival S(e^{σz}) = Q(z), and the partial mean e^{σ²/2} Q(z − σ), on the grid (b's grid is the same).
    let s: Vec<f64> = (0..n).map(|i| q(z(i))).collect();
    let m: Vec<f64> = (0..n).map(|i| (sigma * sigma / 2.0).exp() * q(z(i) - sigma)).collect();
    // The attained times e^{σz} themselves.
    let t: Vec<f64> = (0..n).map(|i| (sigma * z(i)).exp()).collect();
    // ∫_a^b S(x) dx = [e^{σ²/2} Φ(ln x/σ − σ) + x Q(ln x/σ)]_a^b.
    let integral = |i: usize, j: usize| (m[i] - m[j]) + t[j] * s[j] - t[i] * s[i];
    (0..Z_POINTS)
        .map(|i| {
            let sa = s[i];
            // b = ∞: the mean residual life; b → a: the inverse of the hazard rate, S(a) / f(a) with
            // f(a) = φ(z) / (σa).
            let mut best = if sa > 0.0 { (m[i] - t[i] * sa) / sa } else { f64::INFINITY };
            let density = (-z(i) * z(i) / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt() / (sigma * t[i]);
            if density > 0.0 {
                best = best.min(sa / density);
            }
            for j in i + 1..i + 1 + B_POINTS {
                let p = sa - s[j];
                if p > 0.0 {
                    let r = integral(i, j) / p;
                    if r < best {
                        best = r;
                    }
                }
            }
            best
        })
        .collect()
}

/// The rank of a run time taken as exact: the remaining time, or, past it, the attained time (as long again as the
/// job has run: run times are heavy-tailed), at least 1 ms. Both rules rank given estimates so ([`Rule`]).
pub fn exact_rank(estimate: Dur, attained: Dur) -> Dur {
    if estimate.0 > attained.0 {
        Dur(estimate.0 - attained.0)
    } else {
        Dur(attained.0.max(1))
    }
}

/// Bounds on the rank's slope from each grid point on. Between grid points the rank is linear in `z = ln(a)/σ`, so
/// with `a = e^{σz}` (median 1) its slope in `a` on the cell from `z_i` is `ΔR / Z_STEP · e^{−σz} / σ`, largest at
/// the cell's start; before the grid it falls as time is served (slope 1), past it it grows in proportion to the
/// attained time (slope `R_end · e^{−σ Z_MAX}`), and past the median it is at least the attained time (slope 1).
fn slopes(sigma: f64, ranks: &[f64]) -> Vec<f64> {
    let tail = ranks[Z_POINTS - 1] * (-sigma * Z_MAX).exp();
    let mut out = vec![0.0; Z_POINTS];
    let mut m = tail.max(1.0);
    out[Z_POINTS - 1] = m;
    for i in (0..Z_POINTS - 1).rev() {
        let z = Z_MIN + i as f64 * Z_STEP;
        let cell = (ranks[i + 1] - ranks[i]).abs() / Z_STEP * (-sigma * z).exp() / sigma;
        m = m.max(cell);
        out[i] = m;
    }
    out
}

/// [`Row::octaves`] from a row of ranks (see [`LogNormal::rank`] for the rank before, on and past the grid). The
/// interpolated rank between two grid points lies between them, so the most and the least on an interval of `z` are
/// the most and the least at the grid points of the cells it touches (one more each side, against rounding in
/// `rank`'s `z`); each of the three pieces (before, on and past the grid) counts where the octave touches it, give or
/// take a grid step.
fn octaves(sigma: f64, ranks: &[f64], grid_start: f64) -> Box<[Octave]> {
    let slopes = slopes(sigma, ranks);
    let index = |z: f64| ((z - Z_MIN) / Z_STEP).floor();
    let at = |z: f64| index(z).clamp(0.0, (Z_POINTS - 1) as f64) as usize;
    let mut out = vec![Octave::default(); 2 * OCTAVES as usize];
    for (slot, o) in out.iter_mut().enumerate() {
        let d = slot as i32 - OCTAVES;
        // Attained times from 2^(d−1) to 2^(d+1) medians; slot 0 stands for none at all (z = −∞).
        let zlo = if slot == 0 { f64::NEG_INFINITY } else { (d - 1) as f64 * std::f64::consts::LN_2 / sigma };
        let zhi = if slot == 0 { f64::NEG_INFINITY } else { (d + 1) as f64 * std::f64::consts::LN_2 / sigma };
        let (mut most, mut least): (f64, f64) = (0.0, f64::INFINITY);
        // Before the grid the rank falls from `row[0] + e^{σ Z_MIN}` as time is served (a in medians), to about
        // `row[0]` where the grid starts.
        if zlo < Z_MIN {
            most = most.max(ranks[0] + grid_start);
        }
        if zlo < Z_MIN + Z_STEP {
            let a_hi = if slot == 0 { 0.0 } else { (sigma * zhi.min(Z_MIN)).exp() };
            least = least.min(ranks[0] + (grid_start - a_hi));
        }
        // On the grid: the cells the octave touches.
        let cells = &ranks[at(zlo).saturating_sub(1)..=(at(zhi) + 2).min(Z_POINTS - 1)];
        if zhi >= Z_MIN && zlo < Z_MAX {
            most = cells.iter().fold(most, |m, r| m.max(*r));
        }
        if zhi >= Z_MIN - Z_STEP && zlo < Z_MAX + Z_STEP {
            least = cells.iter().fold(least, |m, r| m.min(*r));
        }
        // Past the grid the rank grows from the row's last point in proportion to the attained time.
        if zhi >= Z_MAX {
            most = most.max(ranks[Z_POINTS - 1] * (sigma * (zhi - Z_MAX)).exp());
        }
        if zhi >= Z_MAX - Z_STEP {
            least = least.min(ranks[Z_POINTS - 1]);
        }
        // Past the median a job ranks at no less than the time it has run (`LogNormal::rank`): `quick_bounds`
        // takes the time itself over `most`; in an octave from d = 1 on (over 2^(d−1) medians: past it) the rank is
        // at least 2^(d−1) medians.
        if slot > 0 && d >= 1 {
            least = least.max(2f64.powi(d - 1));
        }
        debug_assert!(least.is_finite() && least > 0.0, "the pieces cover every octave");
        let slope = if zlo < Z_MIN { slopes[0] } else { slopes[at(zlo).saturating_sub(1)] };
        *o = Octave { most, least, slope };
    }
    out.into_boxed_slice()
}

fn table(k: usize) -> &'static Row {
    TABLE[k].get_or_init(|| {
        let sigma = k as f64 * SIGMA_STEP;
        let ranks = row(sigma);
        let grid_start = (sigma * Z_MIN).exp();
        let octaves = octaves(sigma, &ranks, grid_start);
        Row { ranks, octaves, inv_sigma: 1.0 / sigma, grid_start }
    })
}

/// A log-normal run time as the scheduler ranks it: its median and its spread's row of ranks, prepared once per job
/// so that ranking at an attained time costs a logarithm and a table lookup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    /// The spread's row (`0`: taken as exact).
    k: u8,
    median: Dur,
    ln_median: f64,
}

impl LogNormal {
    /// A run time with median `median` and log-spread `sigma` (quantised to [`SIGMA_STEP`], at most
    /// [`SIGMA_MAX`]; below half a step, or not finite, it is taken as exact).
    pub fn new(median: Dur, sigma: f64) -> LogNormal {
        let k = if sigma.is_finite() && sigma > 0.0 { (sigma.min(SIGMA_MAX) / SIGMA_STEP).round() as u8 } else { 0 };
        let median = Dur(median.0.max(1));
        LogNormal { k, median, ln_median: (median.0 as f64).ln() }
    }

    /// The Gittins rank after `attained` of service (see the module's documentation). Taken as exact, the rank is the
    /// remaining time, or, past the median, the attained time (as long again). Past its median a job is never ranked
    /// below the time it has run: for a narrow spread the log-normal's rank falls once a job has outlived it (the
    /// model is refuted by then), which would make a hung job of a steady class all but unevictable and put it back
    /// at the head of the queue after an eviction.
    pub fn rank(&self, attained: Dur) -> Dur {
        if self.k == 0 {
            return exact_rank(self.median, attained);
        }
        let median_ms = self.median.0 as f64;
        let sig = self.k as f64 * SIGMA_STEP;
        let t = table(self.k as usize);
        let row = &t.ranks;
        // Multiplied by 1/σ and 1/Z_STEP (40, exact) rather than divided: two divisions fewer on every rank's path.
        let z =
            if attained.0 > 0 { ((attained.0 as f64).ln() - self.ln_median) * t.inv_sigma } else { f64::NEG_INFINITY };
        let r = if z < Z_MIN {
            // Before the grid nothing ends (S ≈ 1 there): time served comes off the rank at the grid's start.
            row[0] + (t.grid_start - attained.0 as f64 / median_ms)
        } else if z >= Z_MAX {
            row[Z_POINTS - 1] * (sig * (z - Z_MAX)).exp()
        } else {
            let x = ((z - Z_MIN) * (1.0 / Z_STEP)).min((Z_POINTS - 1) as f64);
            let i = (x as usize).min(Z_POINTS - 2);
            let f = x - i as f64;
            row[i] * (1.0 - f) + row[i + 1] * f
        };
        let r = if attained > self.median { (r * median_ms).max(attained.0 as f64) } else { r * median_ms };
        // Rounded to the nearest ms, at least 1 and at most 10^15: `r` is not negative, and below 2^52 `r + 0.5`
        // truncated is `r.round()` (no call to `round`).
        Dur(((r.min(RANK_CAP as f64) + 0.5) as u64).max(1))
    }

    /// The median, as ranked (at least a millisecond): past it a job ranks at no less than the time it has run, so
    /// its rank may jump up as its service passes it.
    pub fn median(&self) -> Dur {
        self.median
    }

    /// Without a logarithm: an upper bound on [`LogNormal::rank`] at `attained` (ms, its rounding included), and a
    /// bound on how fast the rank can move (ms of rank per ms of service, up or down, before its rounding) at any
    /// attained time from `attained` on, at least 1, as the rank is not smooth at the median: past it a job ranks
    /// at no less than the time it has run, so there the rank may jump up once. From the octave of `attained` over
    /// the median (two octaves, as both are whole milliseconds: `⌊log2⌋` of each, `Row::octaves`).
    #[inline]
    pub fn quick_bounds(&self, attained: Dur) -> (u64, f64) {
        if self.k == 0 {
            return (self.median.0.max(attained.0), 1.0);
        }
        let o = table(self.k as usize).octaves[self.octave(attained)];
        // A little over, against rounding in `rank`'s arithmetic, and for its own to whole milliseconds (truncated,
        // then two more: no call to `ceil`); past the median, the time run when that is more (up to the rank's cap).
        let up = (o.most * self.median.0 as f64 * (1.0 + 1e-9)).min(RANK_CAP as f64) as u64 + 2;
        (self.at_least_time_run(up, attained), o.slope)
    }

    /// Without a logarithm: a lower bound on [`LogNormal::rank`] at `attained` (ms, its rounding included; at least
    /// 1), from the same octave as [`LogNormal::quick_bounds`]. (Apart from it: a search needs it for few rows.)
    #[inline]
    pub fn quick_low(&self, attained: Dur) -> u64 {
        if self.k == 0 {
            return exact_rank(self.median, attained).0;
        }
        let o = table(self.k as usize).octaves[self.octave(attained)];
        // A little under, and one less for the rank's rounding to whole milliseconds (truncated: no call to `floor`).
        let low =
            ((o.least * self.median.0 as f64 * (1.0 - 1e-9)).min(RANK_CAP as f64) as u64).saturating_sub(1).max(1);
        // Past the median the rank is at least the time run: closer than the octave's least.
        self.at_least_time_run(low, attained)
    }

    /// `bound`, or past the median the time run when that is more (up to the rank's cap): the rank is never less
    /// there (`LogNormal::rank`).
    #[inline(always)]
    fn at_least_time_run(&self, bound: u64, attained: Dur) -> u64 {
        if attained > self.median {
            bound.max(attained.0.min(RANK_CAP))
        } else {
            bound
        }
    }

    /// The slot in `Row::octaves` of `attained` over the median.
    #[inline(always)]
    fn octave(&self, attained: Dur) -> usize {
        if attained.0 == 0 {
            0
        } else {
            (attained.0.ilog2() as i32 - self.median.0.ilog2() as i32 + OCTAVES) as usize
        }
    }
}

/// How a learned run time is ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// As if the median were exact.
    Median,
    /// By the Gittins rank ([`LogNormal::rank`]).
    Gittins,
}

/// The Gittins rank of a job whose run time is log-normal with median `median` and log-spread `sigma`, after
/// `attained` of service: [`LogNormal::rank`].
pub fn rank(median: Dur, sigma: f64, attained: Dur) -> Dur {
    LogNormal::new(median, sigma).rank(attained)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rank computed independently: S integrated numerically (Simpson on a log grid) and b searched finely.
    fn brute(sigma: f64, a: f64) -> f64 {
        let s = |x: f64| q(x.ln() / sigma);
        let integral = |lo: f64, hi: f64| {
            // ∫ S(x) dx over [lo, hi] with x = e^u.
            let (ul, uh) = (lo.ln(), hi.ln());
            let n = 160;
            let h = (uh - ul) / n as f64;
            let f = |u: f64| s(u.exp()) * u.exp();
            let mut acc = f(ul) + f(uh);
            for k in 1..n {
                acc += f(ul + k as f64 * h) * if k % 2 == 1 { 4.0 } else { 2.0 };
            }
            acc * h / 3.0
        };
        let mut best = f64::INFINITY;
        let reach = (1.0 / a).ln().max(0.0) + 12.0 * sigma;
        for k in 1..=1500 {
            let b = a * (k as f64 / 1500.0 * reach).exp();
            let p = s(a) - s(b);
            if p > 1e-12 {
                best = best.min(integral(a, b) / p);
            }
        }
        best
    }

    #[test]
    fn ranks_agree_with_a_numerical_computation() {
        for sigma in [0.3, 0.5, 1.0, 2.0, 3.0] {
            for a in [0.001f64, 0.05, 0.3, 1.0, 3.0, 20.0] {
                let got = rank(Dur(1_000_000), sigma, Dur((a * 1_000_000.0) as u64)).0 as f64 / 1_000_000.0;
                if (a.ln() / sigma).abs() > 7.5 {
                    continue; // off the table's grid (`ranks_beyond_the_grid_keep_growing_and_stay_finite`)
                }
                // Past the median, never below the time run (see `LogNormal::rank`).
                let want = if a > 1.0 { brute(sigma, a).max(a) } else { brute(sigma, a) };
                assert!((got - want).abs() / want < 0.01, "σ {sigma}, a {a}: {got} against {want}");
            }
        }
    }

    #[test]
    fn past_its_median_a_job_ranks_at_no_less_than_the_time_it_has_run() {
        // A steady class (spread 0.05): the log-normal's rank at ten medians is 0.06 of the median.
        let med = Dur::from_hours(1);
        assert_eq!(rank(med, 0.05, Dur::from_hours(10)), Dur::from_hours(10));
        assert_eq!(rank(med, 0.3, Dur::from_hours(3)), Dur::from_hours(3));
        // A wide one (spread 2: 12.1 medians at ten) ranks it further behind than that on its own.
        assert!(rank(med, 2.0, Dur::from_hours(10)) > Dur::from_hours(12));
        // Before the median the rank is the log-normal's.
        assert!(rank(med, 0.05, Dur::from_mins(30)) < Dur::from_mins(35));
    }

    /// `quick_bounds` bounds the rank from above (`quick_low` from below) at the attained time it is given, and how fast the rank moves from
    /// there on: over every spread, medians of a millisecond to 40 days, attained times from 0 to past the grid
    /// (about 5,000 points each, on a log scale and a millisecond either side of the median), every later point
    /// of each is within `slope × Δ + 1` of it (the rounding), but across the median, where the rank jumps up to
    /// the time run (`preempt.rs` stops its bound there). The bounds are not loose for nothing: at nine points in ten
    /// the rank is within 8× of the bound over it, and of the bound under it.
    #[test]
    fn quick_bounds_bound_the_rank_and_its_slope() {
        let mut close = (0u32, 0u32, 0u32, 0u32);
        for k in 0..ROWS {
            let sigma = k as f64 * SIGMA_STEP;
            for median in [1u64, 977, 3_600_000, 3_456_000_000] {
                let d = LogNormal::new(Dur(median), sigma);
                let mut pts: Vec<u64> = (0..5_000).map(|i| (1.01f64.powi(i) - 1.0) as u64).collect();
                pts.extend([median.saturating_sub(1), median, median + 1]);
                pts.sort_unstable();
                pts.dedup();
                let ranks: Vec<u64> = pts.iter().map(|&a| d.rank(Dur(a)).0).collect();
                for (i, &a) in pts.iter().enumerate() {
                    let ((up, slope), low) = (d.quick_bounds(Dur(a)), d.quick_low(Dur(a)));
                    assert!(ranks[i] <= up, "σ {sigma}, median {median}, at {a}: rank {} over {up}", ranks[i]);
                    assert!(low <= ranks[i], "σ {sigma}, median {median}, at {a}: rank {} under {low}", ranks[i]);
                    close.3 += 1;
                    if ranks[i] <= low.saturating_mul(8).max(16) {
                        close.2 += 1;
                    }
                    assert!(slope >= 1.0);
                    close.1 += 1;
                    if up <= ranks[i].saturating_mul(8).max(16) {
                        close.0 += 1;
                    }
                    for (j, &b) in pts.iter().enumerate().skip(i + 1).take(40) {
                        if a <= median && b >= median {
                            break; // the jump at the median (at it for an exact estimate, past it else)
                        }
                        let moved = ranks[j].abs_diff(ranks[i]) as f64;
                        assert!(
                            moved <= slope * (b - a) as f64 + 1.0,
                            "σ {sigma}, median {median}, {a} → {b}: rank {} → {} against slope {slope}",
                            ranks[i],
                            ranks[j]
                        );
                    }
                }
            }
        }
        assert!(close.0 * 10 >= close.1 * 9 && close.2 * 10 >= close.3 * 9, "{close:?}");
    }

    #[test]
    fn spreads_are_capped() {
        assert_eq!(rank(Dur::from_hours(1), 6.0, Dur::ZERO), rank(Dur::from_hours(1), SIGMA_MAX, Dur::ZERO));
        let fresh = rank(Dur::from_hours(1), SIGMA_MAX, Dur::ZERO).0 as f64 / 3_600_000.0;
        assert!((fresh - 0.087).abs() < 0.002, "{fresh}");
    }

    #[test]
    fn an_exact_estimate_ranks_by_remaining_time() {
        assert_eq!(rank(Dur(100_000), 0.0, Dur(30_000)), Dur(70_000));
        assert_eq!(rank(Dur(100_000), 0.0, Dur(150_000)), Dur(150_000), "past its estimate: as long again");
        // A narrow spread is close to the same.
        let r = rank(Dur(100_000), 0.05, Dur(30_000)).0 as f64;
        assert!((r - 70_000.0).abs() < 7_000.0, "{r}");
    }

    #[test]
    fn a_wide_spread_favours_young_jobs_and_demotes_old_ones() {
        let med = Dur::from_hours(1);
        let young = rank(med, 2.0, Dur::ZERO);
        let old = rank(med, 2.0, Dur::from_hours(10));
        // A new job of a wide class may end soon: it ranks ahead of its median ...
        assert!(young < med, "{young:?}");
        // ... and one that has run ten times its median is likely one of the long ones: far behind.
        assert!(old > Dur::from_hours(10), "{old:?}");
        // Ranks scale with the median.
        let r1 = rank(Dur::from_secs(100), 1.5, Dur::from_secs(50)).0 as f64;
        let r2 = rank(Dur::from_secs(10_000), 1.5, Dur::from_secs(5_000)).0 as f64;
        assert!((r2 / r1 - 100.0).abs() < 0.5, "{r1} {r2}");
    }

    #[test]
    fn ranks_beyond_the_grid_keep_growing_and_stay_finite() {
        let med = Dur::from_secs(10);
        let a = rank(med, 0.5, Dur::from_hours(1_000));
        let b = rank(med, 0.5, Dur::from_hours(2_000));
        assert!(b.0.abs_diff(2 * a.0) < a.0 / 100 && a > Dur::from_hours(10), "{a:?} {b:?}");
        assert!(rank(med, f64::NAN, Dur::ZERO) == med);
        assert!(rank(med, 1e9, Dur(u64::MAX / 2)).0 <= RANK_CAP);
    }
}

//! The text forms of job arrays and dependencies, as Slurm users write them: `--array 0-99:2%8` (ranges with a step,
//! lists `1,3,7`, a concurrency limit `%8`) and `--dependency afterok:12:13,afterany:14[2],singleton` (jobs by id,
//! `job-12`, or one array element by its index, `12[2]`). Parsing costs time linear in the text and the element count,
//! which is bounded before anything is expanded.

use crate::error::ApiError;
use gpunet_core::job::{MAX_ARRAY_ELEMENTS, MAX_ARRAY_INDEX, MAX_DEPENDENCIES};
use gpunet_core::{ArraySpec, DepKind};
use std::fmt;

/// Longest array or dependency text accepted.
pub const MAX_TEXT: usize = 4096;

/// Parses an array spec: comma-separated `N`, `A-B` or `A-B:STEP`, then an optional `%LIMIT`.
pub fn parse_array(field: &str, text: &str) -> Result<ArraySpec, ApiError> {
    let allowed = "indices like 0-99, 0-99:2 or 1,3,7 (0 to 9999999, at most 100000 in all), optionally %LIMIT";
    let bad = || ApiError::invalid(field, text, allowed);
    if text.is_empty() || text.len() > MAX_TEXT {
        return Err(bad());
    }
    let (list, limit) = match text.split_once('%') {
        Some((l, n)) => (l, Some(n.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(bad)?)),
        None => (text, None),
    };
    let num = |s: &str| s.parse::<u32>().ok().filter(|n| *n <= MAX_ARRAY_INDEX).ok_or_else(bad);
    let mut ranges = Vec::new();
    let mut total = 0u64;
    for item in list.split(',') {
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (r, num(s).ok().filter(|s| *s > 0).ok_or_else(bad)?),
            None => (item, 1),
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(range)?, num(range)?),
        };
        if a > b {
            return Err(bad());
        }
        total += ((b - a) / step) as u64 + 1;
        if total > MAX_ARRAY_ELEMENTS as u64 {
            return Err(bad());
        }
        ranges.push((a, b, step));
    }
    let mut indices: Vec<u32> = ranges.iter().flat_map(|&(a, b, s)| (a..=b).step_by(s as usize)).collect();
    indices.sort_unstable();
    indices.dedup();
    Ok(ArraySpec { indices, limit })
}

/// A job named in a dependency: an id, or one element of an array by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRef {
    /// The job's (or array's) id.
    pub id: u64,
    /// The element's index within the array `id`.
    pub index: Option<u32>,
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "job-{}[{i}]", self.id),
            None => write!(f, "job-{}", self.id),
        }
    }
}

/// Parses a job reference: `12`, `job-12`, `12[3]` or `job-12[3]`.
pub fn parse_job_ref(field: &str, text: &str) -> Result<JobRef, ApiError> {
    let bad = || ApiError::invalid(field, text, "a job id like 12, job-12, or an array element like 12[3]");
    let t = text.strip_prefix("job-").unwrap_or(text);
    let (id, index) = match t.strip_suffix(']').and_then(|t| t.split_once('[')) {
        Some((id, i)) => (id, Some(i.parse::<u32>().map_err(|_| bad())?)),
        None => (t, None),
    };
    let id = id.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(bad)?;
    Ok(JobRef { id, index })
}

/// Parses a dependency list: comma-separated `afterok:ID[:ID…]`, `afterany:…`, `afternotok:…` or `singleton`.
pub fn parse_dependency(field: &str, text: &str) -> Result<Vec<(DepKind, Vec<JobRef>)>, ApiError> {
    let allowed = "afterok:ID[:ID…], afterany:…, afternotok:… or singleton, comma-separated (at most 256 jobs)";
    if text.is_empty() || text.len() > MAX_TEXT {
        return Err(ApiError::invalid(field, text, allowed));
    }
    let mut out = Vec::new();
    let mut named = 0;
    for item in text.split(',') {
        let mut parts = item.split(':');
        let kind = match parts.next().unwrap_or_default() {
            "afterok" => DepKind::AfterOk,
            "afterany" => DepKind::AfterAny,
            "afternotok" => DepKind::AfterNotOk,
            "singleton" => DepKind::Singleton,
            _ => return Err(ApiError::invalid(field, item, allowed)),
        };
        let jobs = parts.map(|p| parse_job_ref(field, p)).collect::<Result<Vec<_>, _>>()?;
        named += jobs.len();
        if (kind == DepKind::Singleton) != jobs.is_empty() || named > MAX_DEPENDENCIES {
            return Err(ApiError::invalid(field, item, allowed));
        }
        out.push((kind, jobs));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_take_ranges_steps_lists_and_a_limit() {
        let a = parse_array("array", "0-99%8").unwrap();
        assert_eq!((a.indices.len(), a.indices[99], a.limit), (100, 99, Some(8)));
        assert_eq!(parse_array("array", "0-9:4").unwrap().indices, vec![0, 4, 8]);
        assert_eq!(parse_array("array", "7,1,3,3").unwrap().indices, vec![1, 3, 7]);
        for bad in ["", "5-1", "0-9:0", "1%0", "x", "0-100000", "0-9999999", "1,,2", "-1"] {
            let e = parse_array("array", bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("array"), "{bad}");
        }
        assert_eq!(parse_array("array", "0-99999").unwrap().indices.len(), 100_000);
    }

    #[test]
    fn dependencies_name_jobs_and_elements() {
        let d = parse_dependency("dependency", "afterok:12:job-13,afternotok:14[2],singleton").unwrap();
        assert_eq!(d[0], (DepKind::AfterOk, vec![JobRef { id: 12, index: None }, JobRef { id: 13, index: None }]));
        assert_eq!(d[1], (DepKind::AfterNotOk, vec![JobRef { id: 14, index: Some(2) }]));
        assert_eq!(d[2], (DepKind::Singleton, vec![]));
        for bad in ["afterok", "after:1", "afterok:x", "singleton:3", "afterok:0", "afterok:1?2", ""] {
            assert!(parse_dependency("dependency", bad).is_err(), "{bad}");
        }
    }
}

//! How the CLI prints: the output formats (`-o table|wide|json|yaml`), times as local instants with a relative
//! duration, standard output that a closed pipe ends quietly, and `--watch`.

use anyhow::{bail, Result};
use gpunet_api::units::format_duration_ms;
use std::io::Write as _;

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// A table for people.
    Table,
    /// The table with more columns.
    Wide,
    /// The API's JSON, pretty-printed.
    Json,
    /// The API's document as YAML.
    Yaml,
}

impl Output {
    /// Parses `--output`.
    pub(crate) fn parse(s: &str) -> Result<Output> {
        Ok(match s {
            "table" => Output::Table,
            "wide" => Output::Wide,
            "json" => Output::Json,
            "yaml" => Output::Yaml,
            _ => bail!("invalid --output {s:?}: allowed are table, wide, json and yaml"),
        })
    }

    /// JSON or YAML: a document for scripts rather than a table.
    pub(crate) fn is_document(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }
}

/// Writes to standard output. A reader that went away (`gpunet jobs -o json | head -1`) ends the process quietly
/// with status 0, as the pipeline asked, instead of a panic.
pub(crate) fn out(text: &str) {
    out_bytes(text.as_bytes());
}

/// [`out`] for bytes (a job's log).
pub(crate) fn out_bytes(b: &[u8]) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(b).and_then(|_| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        crate::say!("error: write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Prints `v` as the output format asks: the document itself for json/yaml, else `table(v, wide)`.
pub(crate) fn emit<T: serde::Serialize>(o: Output, v: &T, table: impl FnOnce(&T, bool) -> String) -> Result<()> {
    match o {
        Output::Json => out(&(serde_json::to_string_pretty(v)? + "\n")),
        Output::Yaml => out(&serde_norway::to_string(v)?),
        Output::Table => out(&terminal_safe(&table(v, false))),
        Output::Wide => out(&terminal_safe(&table(v, true))),
    }
    Ok(())
}

/// Text for a terminal: every line's characters a terminal would act on (controls but the line ends, bidirectional
/// overrides) escaped, as [`crate::client::printable`] does for a table's cells — free text such as a dependency or an
/// event's message cannot move the cursor either.
fn terminal_safe(text: &str) -> String {
    text.split('\n').map(|l| crate::client::printable(l)).collect::<Vec<_>>().join("\n")
}

/// The current time, ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    gpunet_server::now_ms()
}

/// An instant as a local time: `2026-12-01 09:14:05`.
pub(crate) fn local(ms: u64) -> String {
    use chrono::TimeZone as _;
    match chrono::Local.timestamp_millis_opt(ms.min(i64::MAX as u64) as i64).single() {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S").to_string(),
        None => format!("{ms} ms after the epoch"),
    }
}

/// How far an instant is from `now`: `3m20s ago`, `in 2h5m`, `now`.
pub(crate) fn relative_to(ms: u64, now: u64) -> String {
    if ms + 500 < now {
        format!("{} ago", format_duration_ms(now - ms))
    } else if ms > now + 500 {
        format!("in {}", format_duration_ms(ms - now))
    } else {
        "now".into()
    }
}

/// An instant for people: the local time and how far it is from now, `2026-12-01 09:14:05 (3m20s ago)`.
pub(crate) fn when(ms: u64) -> String {
    format!("{} ({})", local(ms), relative_to(ms, now_ms()))
}

/// A short relative time for table cells: `3m20s ago`.
pub(crate) fn ago(ms: u64) -> String {
    relative_to(ms, now_ms())
}

/// Runs `render` once, or with `watch` again every two seconds until interrupted: a terminal's screen is cleared
/// before each render, other output gets a blank line between renders.
pub(crate) async fn watching<F, Fut>(watch: bool, mut render: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    use std::io::IsTerminal as _;
    if !watch {
        return render().await;
    }
    let tty = std::io::stdout().is_terminal();
    loop {
        if tty {
            out("\x1b[2J\x1b[H");
        }
        out(&format!("every 2s, {} (Ctrl-C stops)\n", local(now_ms())));
        render().await?;
        if !tty {
            out("\n");
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_as_durations() {
        assert_eq!(relative_to(1_000, 201_000), "3m20s ago");
        assert_eq!(relative_to(7_501_000, 1_000), "in 2h5m");
        assert_eq!(relative_to(1_000, 1_200), "now");
    }

    #[test]
    fn local_times_are_dates_not_offsets() {
        let s = local(1_764_580_000_000);
        assert!(s.starts_with("2025-12-01") || s.starts_with("2025-11-30"), "{s}");
        assert!(!s.contains("t+"), "{s}");
        assert!(Output::parse("xml").is_err());
        assert_eq!(Output::parse("wide").unwrap(), Output::Wide);
    }
}

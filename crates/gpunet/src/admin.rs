//! `gpunet admin`: operations on a store, run beside (backup) or instead of (migrate) the server; what an operator
//! installs beside the binary (the server's configuration file, man pages, alert rules).

use anyhow::{bail, Context, Result};
use gpunet_store::StoreUrl;
use std::path::PathBuf;

/// Store operations.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum AdminCmd {
    /// Print gpunet's Prometheus alert rules (`deploy/prometheus/gpunet-rules.yml`) for a Prometheus `rule_files`.
    AlertRules,
    /// Copy everything (tenants, tokens, nodes, jobs, events, ledger, samples) from one store into an empty one and
    /// verify the row counts. Stop the server first.
    Migrate(MigrateArgs),
    /// Copy a SQLite store to a file while the server keeps running (SQLite's online backup API).
    Backup(BackupArgs),
    /// Print the server's configuration file (`gpunet server --config FILE`) with every key at its default.
    Config,
    /// Write man pages (gpunet.1, gpunet-server.1, …, one per command) into a directory, e.g.
    /// /usr/local/share/man/man1.
    Man {
        /// Directory to write them to (created if missing).
        dir: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// The store to read: `sqlite://DATA_DIR` (the directory holding gpunet.db) or `postgres://…`.
    #[arg(long)]
    from: String,
    /// The store to fill, empty (created and migrated if needed): `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` or
    /// `sqlite://DATA_DIR`.
    #[arg(long, env = "GPUNET_MIGRATE_TO", hide_env_values = true)]
    to: String,
    /// table or json.
    #[arg(long, default_value = "table")]
    output: String,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BackupArgs {
    /// The server's data directory (holding gpunet.db).
    #[arg(long, default_value = "gpunet-data")]
    data_dir: PathBuf,
    /// The backup file to write (must not exist; created 0600).
    #[arg(long)]
    to: PathBuf,
}

pub(crate) fn run(cmd: AdminCmd) -> Result<()> {
    match cmd {
        AdminCmd::AlertRules => {
            crate::cli::output::out(crate::monitoring::ALERT_RULES);
            Ok(())
        }
        AdminCmd::Migrate(a) => migrate(a),
        AdminCmd::Config => {
            crate::cli::output::out(&crate::config::template());
            Ok(())
        }
        AdminCmd::Man { dir } => {
            use clap::CommandFactory as _;
            let files = crate::ops::write_man_pages(crate::Cli::command(), &dir)?;
            println!("wrote {} man pages to {}", files.len(), dir.display());
            Ok(())
        }
        AdminCmd::Backup(a) => {
            let bytes = gpunet_store::backup(&a.data_dir, &a.to)
                .with_context(|| format!("back up {}", a.data_dir.display()))?;
            println!("backed up {} to {} ({bytes} bytes)", a.data_dir.join("gpunet.db").display(), a.to.display());
            Ok(())
        }
    }
}

fn migrate(a: MigrateArgs) -> Result<()> {
    if !matches!(a.output.as_str(), "table" | "json") {
        bail!("invalid --output {:?}: allowed are table and json", a.output);
    }
    let from = StoreUrl::parse(&a.from).context("invalid --from")?;
    let to = StoreUrl::parse(&a.to).context("invalid --to")?;
    if from == to {
        bail!("invalid --to: it is the same store as --from");
    }
    if let StoreUrl::Sqlite(dir) = &from {
        // Opening would create an empty store: a mistyped path must not read as "nothing to copy".
        if !dir.join("gpunet.db").is_file() {
            bail!("invalid --from: no gpunet.db in {}", dir.display());
        }
    }
    let src = gpunet_store::open(&from).context("open --from")?;
    let dst = gpunet_store::open(&to).context("open --to")?;
    let counts = gpunet_store::copy(&*src, &*dst).context("migrate")?;
    dst.probe_writable().context("check --to")?;
    if a.output == "json" {
        println!("{}", serde_json::to_string_pretty(&counts)?);
    } else {
        println!("copied and verified:");
        for (what, n) in [
            ("tenants", counts.tenants),
            ("tokens", counts.tokens),
            ("token records", counts.token_docs),
            ("nodes", counts.nodes),
            ("jobs", counts.jobs),
            ("events", counts.events),
            ("ledger rows", counts.usage),
            ("samples", counts.samples),
        ] {
            println!("  {what:<14} {n}");
        }
    }
    Ok(())
}

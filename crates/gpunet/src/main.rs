//! `gpunet`: the one binary of the gpunet compute network.

mod bench;
mod sim_cmd;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "gpunet", version, about = "An open-source AI compute network: pooled GPUs, fair scheduling, traces.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Replay a cluster trace on a virtual clock through the real scheduler.
    Sim(Box<sim_cmd::SimCmd>),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// One full scheduling pass over a synthetic cluster, then a stream of arrival/completion events.
    Sched(bench::sched::SchedArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Sim(cmd) => sim_cmd::run(*cmd)?,
        Cmd::Bench { what: BenchCmd::Sched(args) } => {
            if !matches!(args.output.as_str(), "table" | "json") {
                bail!("invalid --output {:?}: allowed is table or json", args.output);
            }
            let r = bench::sched::run(&args)?;
            if args.output == "json" {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("policy          {}", r.policy);
                println!("full_pass_ms    {:.1}", r.full_pass_ms);
                println!("placed          {}", r.placed);
                println!("event_p50_us    {:.1}", r.event_p50_us);
                println!("event_p99_us    {:.1}", r.event_p99_us);
                println!("peak_rss_mib    {:.1}", r.peak_rss_mib);
            }
        }
    }
    Ok(())
}

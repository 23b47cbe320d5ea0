#!/usr/bin/env python3
"""Issue 17's choice of a default policy: every candidate scheduler setting replayed by `gpunet sim` over the workloads
built from the shipped traces (by default the same workloads choose the setting and report its figures, in sample;
with --held-out on separate parts), with learned estimates (`--estimates history`) and the simulator's realistic
eviction costs (checkpoints every 30 minutes, measured stop times, minimum run time, eviction rate limit).

    scripts/choose-default.py [BINARY] [--jobs N] [--out FILE.json] [--held-out] [--only SETTING ...]

With --held-out the workloads are split in two: the setting is chosen on one part and its figures are reported on
the other, which played no part in the choice. Choice: the first half of the Philly trace (by submission time) at
both loads, PAI 2023, and the odd-numbered Pollux and Sia workloads. Held out: the second half of the Philly trace at
both loads and the even-numbered Pollux and Sia workloads (PAI 2023 is one trace of mostly long-lived pods; it is
only in the choice).

Workloads (data/traces/): Philly at 82% and 90% load (`philly/pool-456.toml`, `pool-416.toml`, the whole trace);
PAI 2023 (`pai2023/openb_pod_list_default.csv.gz`) on 6 nodes of 8 GPUs, 128 cores and 1 TiB (the trace's pods are mostly
long-lived services: on its own 1,213 nodes nothing waits; on 6 they contend, for CPU as much as for GPUs); the Pollux workloads (`pollux/workloads/workload-1..8`) and Sia's Philly, Saturn
and new-trace workloads (`sia/*/workload-*`) on the `pollux` preset (16 nodes × 4 T4).

For each setting it prints, per workload family, the average total wait (time not running: queueing, every wait
after an eviction, restart backoff), Jain's index over tenants' slowdowns, and the GPU-hours lost to evictions (% of
used); then the settings ranked by the geometric mean over families of their average wait relative to FIFO's.
A family of several workloads (Pollux, Sia) counts as the mean of its workloads' ratios, so that each family
weighs the same. Last it names the setting with the lowest score among those that lose at most 5% of GPU-hours to
evictions on every workload: with --held-out, on the choosing part, that is the default, `auto`
(`SchedConfig::recommended`). The settings are every
policy with backfill but `priority` (the traces carry no priorities: it is FIFO on them), SJF/SRTF/SRGF also
preemptive for shorter jobs at the default ratio of 2, preemptive SRTF/SRGF at ratios of 8 and 16 (a `[scheduler]` table appended to a copy of the cluster file), and with
defragmentation (`--defragment`) LAS, SRGF, and preemptive SRTF/SRGF at ratios 2 and 8, and of those SRTF/SRGF at
ratio 8 and SRGF at ratio 12 with Gittins ranks (`learned_rank = "gittins"`). --only SETTING (repeatable) replays
only the settings named, and FIFO for the ratios. With --held-out it also replays, on the held-out workloads only
and as no candidate, Tiresias's DLAS-GPU queues (three, split at 3,250 and 7,200 GPU-seconds) in Tiresias's
simulator's model (GPUs counted, evictions free: no stop time, checkpoints every minute, no minimum run time or rate
limit) and in the realistic one, next to `auto` in each (`TIRESIAS`; --only may name them). The JSON written
with --out holds every run's figures. The PAI pool's size is a choice: see docs/scheduler.md.
"""
import argparse
import concurrent.futures
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(ROOT, "data", "traces")

def pool(count, gpus, model, cpu_milli, memory_mib, rack_size=None):
    """A cluster file of one node group."""
    rack = f"rack_size = {rack_size}\n" if rack_size else ""
    return (f"version = 1\n[[node_group]]\ncount = {count}\ngpus_per_node = {gpus}\ngpu_model = \"{model}\"\n"
            f"cpu_milli = {cpu_milli}\nmemory_mib = {memory_mib}\n{rack}")


PAI_POOL = pool(6, 8, "V100-16GB", 128000, 1048576)
# The `pollux` preset, written out (for a copy with a `[scheduler]` table).
POLLUX_POOL = pool(16, 4, "T4", 48000, 196608, rack_size=16)

# name -> extra `gpunet sim` arguments (all with --backfill and learned estimates), and `[scheduler]` knobs for the
# cluster file (the `pollux` preset is written out as POLLUX_POOL for that).
SETTINGS = {
    "fifo": ["--policy", "fifo"],
    "sjf": ["--policy", "sjf"],
    "srtf": ["--policy", "srtf"],
    "srgf": ["--policy", "srgf"],
    "drf": ["--policy", "drf"],
    "fairshare": ["--policy", "fairshare"],
    "las": ["--policy", "las"],
    "sjf preemptive": ["--policy", "sjf", "--preemptive"],
    "srtf preemptive": ["--policy", "srtf", "--preemptive"],
    "srgf preemptive": ["--policy", "srgf", "--preemptive"],
    "srtf preemptive ratio 8": ["--policy", "srtf", "--preemptive"],
    "srtf preemptive ratio 16": ["--policy", "srtf", "--preemptive"],
    "srgf preemptive ratio 8": ["--policy", "srgf", "--preemptive"],
    "srgf preemptive ratio 16": ["--policy", "srgf", "--preemptive"],
    "las defragment": ["--policy", "las", "--defragment"],
    "srgf defragment": ["--policy", "srgf", "--defragment"],
    "srtf preemptive defragment": ["--policy", "srtf", "--preemptive", "--defragment"],
    "srgf preemptive defragment": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srtf preemptive ratio 8 defragment": ["--policy", "srtf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 8 defragment": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srtf preemptive ratio 8 defragment gittins": ["--policy", "srtf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 8 defragment gittins": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 12 defragment gittins": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 8 defragment probe 10m": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 8 defragment probe 15m": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srgf preemptive ratio 8 defragment probe 30m": ["--policy", "srgf", "--preemptive", "--defragment"],
    "srtf preemptive ratio 8 defragment probe 15m": ["--policy", "srtf", "--preemptive", "--defragment"],
}
# Tiresias's simulator's model (`SymbioticLab/Tiresias` `simulator/run_sim.py`, `dlas_sim_jobs`): GPUs counted, not
# placed on nodes (`--gpu-counting`), and an evicted job stops at once and loses nothing (here: checkpoints every
# minute, no stop time, no minimum run time, no eviction rate limit).
TIRESIAS_MODEL = ["--gpu-counting", "--stop-time-s", "0", "--min-run-time-s", "0", "--max-evictions", "100000000",
                  "--checkpoint-mins", "1"]
# Side by side with Tiresias (--held-out, on the held-out workloads; no part in the choice): Tiresias's DLAS-GPU
# queues (`--schedule dlas-gpu`: `jobs.py`'s three queues split at 3,250 and 7,200 GPU-seconds of attained service,
# no starvation promotion) in gpunet's `las`, in Tiresias's model and in the realistic one, and `auto` in both.
# gpunet still differs from Tiresias's simulator: EASY backfill (Tiresias starts any job that fits, with no
# reservation), a pass on events and a 60-second tick.
TIRESIAS = {
    "tiresias dlas-gpu, its model": ["--policy", "las", "--las-thresholds", "3250,7200", *TIRESIAS_MODEL],
    "tiresias dlas-gpu, realistic": ["--policy", "las", "--las-thresholds", "3250,7200"],
    "auto, tiresias's model": ["--policy", "auto", *TIRESIAS_MODEL],
    "auto, realistic": ["--policy", "auto"],
}
KNOBS = {
    "srtf preemptive ratio 8": "shorter_ratio = 8\n",
    "srtf preemptive ratio 16": "shorter_ratio = 16\n",
    "srgf preemptive ratio 8": "shorter_ratio = 8\n",
    "srgf preemptive ratio 16": "shorter_ratio = 16\n",
    "srtf preemptive ratio 8 defragment": "shorter_ratio = 8\n",
    "srgf preemptive ratio 8 defragment": "shorter_ratio = 8\n",
    "srtf preemptive ratio 8 defragment gittins": "shorter_ratio = 8\nlearned_rank = \"gittins\"\n",
    "srgf preemptive ratio 8 defragment gittins": "shorter_ratio = 8\nlearned_rank = \"gittins\"\n",
    "srgf preemptive ratio 12 defragment gittins": "shorter_ratio = 12\nlearned_rank = \"gittins\"\n",
    "srgf preemptive ratio 8 defragment probe 10m": "shorter_ratio = 8\nprobe = \"10m\"\n",
    "srgf preemptive ratio 8 defragment probe 15m": "shorter_ratio = 8\nprobe = \"15m\"\n",
    "srgf preemptive ratio 8 defragment probe 30m": "shorter_ratio = 8\nprobe = \"30m\"\n",
    "srtf preemptive ratio 8 defragment probe 15m": "shorter_ratio = 8\nprobe = \"15m\"\n",
}


def workloads(pai_pool):
    """(family, label, trace, cluster) of every workload."""
    out = [
        ("philly-82", "philly 82%", f"{TRACES}/philly/philly_pollux.csv.gz", f"{TRACES}/philly/pool-456.toml"),
        ("philly-90", "philly 90%", f"{TRACES}/philly/philly_pollux.csv.gz", f"{TRACES}/philly/pool-416.toml"),
        ("pai2023", "pai2023 48 GPUs", f"{TRACES}/pai2023/openb_pod_list_default.csv.gz", pai_pool),
    ]
    for w in sorted(glob.glob(f"{TRACES}/pollux/workloads/workload-*.csv")):
        out.append(("pollux", os.path.basename(w), w, "pollux"))
    for sub in ("philly", "saturn", "newtrace"):
        for w in sorted(glob.glob(f"{TRACES}/sia/{sub}/workload-*.csv")):
            out.append((f"sia-{sub}", f"{sub}/{os.path.basename(w)}", w, "pollux"))
    return out


def philly_halves(tmp):
    """The Philly trace's first and second half by submission time, as two CSV files in `tmp`."""
    import csv
    import gzip
    with gzip.open(f"{TRACES}/philly/philly_pollux.csv.gz", "rt", newline="") as f:
        rows = list(csv.reader(f))
    head, body = rows[0], [r for r in rows[1:] if r]
    body.sort(key=lambda r: r[0])  # "YYYY-MM-DD HH:MM:SS" sorts as text
    mid = len(body) // 2
    paths = []
    for name, part in (("first", body[:mid]), ("second", body[mid:])):
        path = os.path.join(tmp, f"philly-{name}-half.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerows(part)
        paths.append(path)
    return paths


def split(wl, tmp):
    """(chosen on, held out): see --held-out."""
    first, second = philly_halves(tmp)
    choose, held = [], []
    for fam, label, trace, cluster in wl:
        if fam.startswith("philly"):
            choose.append((fam, label + " 1st half", first, cluster))
            held.append((fam, label + " 2nd half", second, cluster))
        elif fam == "pai2023":
            choose.append((fam, label, trace, cluster))
        else:
            n = int(os.path.basename(trace).split("-")[1].split(".")[0])
            (choose if n % 2 == 1 else held).append((fam, label, trace, cluster))
    return choose, held


def with_knobs(cluster, knobs, tmp):
    """The cluster file with a `[scheduler]` table of `knobs` appended (a copy in `tmp`)."""
    if not knobs:
        return cluster
    text = POLLUX_POOL if cluster == "pollux" else open(cluster).read()
    path = os.path.join(tmp, f"{len(os.listdir(tmp))}.toml")
    with open(path, "w") as f:
        f.write(text + "\n[scheduler]\n" + knobs)
    return path


def run(binary, setting, trace, cluster):
    cmd = [binary, "sim", *(SETTINGS.get(setting) or TIRESIAS[setting]), "--backfill", "--estimates", "history", "--trace", trace,
           "--cluster", cluster, "--output", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    d = json.loads(p.stdout)
    return {k: d[k] for k in ("avg_wait_s", "jain_fairness", "eviction_lost_fraction", "wall_ms", "jobs",
                              "completed", "preemptions", "utilization_span")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "target", "release", "gpunet"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="replays run at once")
    ap.add_argument("--out", help="write every run's figures here (JSON)")
    ap.add_argument("--held-out", action="store_true", help="choose on one part of the workloads, report on the rest")
    ap.add_argument("--only", action="append", metavar="SETTING",
                    help="replay only this setting (repeatable; FIFO, the baseline, always runs)")
    a = ap.parse_args()
    if a.only:
        unknown = [s for s in a.only if s not in SETTINGS and s not in TIRESIAS]
        if unknown:
            raise SystemExit(f"--only: unknown setting(s) {unknown}; known: {list(SETTINGS) + list(TIRESIAS)}")
        for s in list(SETTINGS):
            if s != "fifo" and s not in a.only:
                del SETTINGS[s]
        for s in list(TIRESIAS):
            if s not in a.only:
                del TIRESIAS[s]
    tmp = tempfile.mkdtemp(prefix="gpunet-choose-default.")
    pai_pool = os.path.join(tmp, "pai-48.toml")
    with open(pai_pool, "w") as f:
        f.write(PAI_POOL)
    try:
        wl = workloads(pai_pool)
        held = []
        if a.held_out:
            wl, held = split(wl, tmp)
        # The longest replays (Philly) first, so that the pool stays busy.
        jobs = [(s, w) for w in wl + held for s in SETTINGS]
        jobs += [(s, w) for w in held for s in TIRESIAS]
        jobs.sort(key=lambda sw: not sw[1][0].startswith("philly"))
        results = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
            # Each cluster file with knobs is written once, before any replay reads it.
            clusters = {(s, w[3]): with_knobs(w[3], KNOBS.get(s), tmp) for s, w in jobs}
            futs = {ex.submit(run, a.binary, s, w[2], clusters[(s, w[3])]): (s, w) for s, w in jobs}
            for fut in concurrent.futures.as_completed(futs):
                s, w = futs[fut]
                results[(s, w[1])] = fut.result()
                print(f"  {s:17} {w[1]:22} wait {results[(s, w[1])]['avg_wait_s']:>12,.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(tmp)

    def table(wl, title, settings=SETTINGS):
        """Prints the settings' figures over the workloads `wl`; returns their scores."""
        families = []
        for fam, _, _, _ in wl:
            if fam not in families:
                families.append(fam)
        members = {fam: [w[1] for w in wl if w[0] == fam] for fam in families}
        labels = [w[1] for w in wl]

        def fam_stat(s, fam, key):
            return sum(results[(s, l)][key] for l in members[fam]) / len(members[fam])

        def fam_ratio(s, fam):
            # Mean over the family's workloads of the wait relative to FIFO's on the same workload.
            rs = []
            for l in members[fam]:
                base = results[("fifo", l)]["avg_wait_s"]
                rs.append((results[(s, l)]["avg_wait_s"] + 1.0) / (base + 1.0))
            return sum(rs) / len(rs)

        score = {s: math.exp(sum(math.log(fam_ratio(s, f)) for f in families) / len(families)) for s in settings}
        print(f"\n{title}")
        print("\n| setting | " + " | ".join(families) + " | wait ÷ FIFO (geo. mean) | worst Jain | max GPU-h lost |")
        print("|---|" + "---:|" * (len(families) + 3))
        for s in sorted(settings, key=lambda s: score[s]):
            cells = []
            for f in families:
                cells.append(f"{fam_stat(s, f, 'avg_wait_s'):,.0f} s / {fam_stat(s, f, 'jain_fairness'):.2f} / "
                             f"{100 * fam_stat(s, f, 'eviction_lost_fraction'):.2f}%")
            worst_jain = min(results[(s, l)]["jain_fairness"] for l in labels)
            lost = max(results[(s, l)]["eviction_lost_fraction"] for l in labels)
            print(f"| {s} | " + " | ".join(cells) + f" | {score[s]:.3f} | {worst_jain:.3f} | {100 * lost:.2f}% |")
        return score, members

    score, members = table(wl, "Workloads the setting is chosen on:" if held else "Every workload:")
    chosen_on = [w[1] for w in wl]
    feasible = [s for s in SETTINGS if max(results[(s, l)]["eviction_lost_fraction"] for l in chosen_on) <= 0.05]
    best = min(feasible, key=lambda s: score[s])
    print(f"\nLowest wait with at most 5% of GPU-hours lost to evictions on every workload: {best} ({score[best]:.3f})")
    held_score = tiresias_score = None
    if held:
        held_score, held_members = table(held, "Held-out workloads (no part in the choice):")
        members = {"chosen on": members, "held out": held_members}
        rank = sorted(SETTINGS, key=lambda s: held_score[s]).index(best) + 1
        lost = max(results[(best, w[1])]["eviction_lost_fraction"] for w in held)
        print(f"\nOn the held-out workloads {best} scores {held_score[best]:.3f}, rank {rank} of {len(SETTINGS)}, "
              f"at most {100 * lost:.2f}% of GPU-hours lost to evictions")
        if TIRESIAS:
            tiresias_score, _ = table(held, "Side by side with Tiresias, held-out workloads (not candidates):", TIRESIAS)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"families": members,
                       "runs": [{"setting": s, "workload": l, **v} for (s, l), v in sorted(results.items())],
                       "score": score, "held_out_score": held_score, "tiresias_score": tiresias_score,
                       "chosen": best}, f, indent=1)


if __name__ == "__main__":
    main()

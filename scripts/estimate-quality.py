#!/usr/bin/env python3
"""How well run times can be learned from a trace's history, and what the estimates' errors cost fairness.

Input: the per-job CSV of a replay with learned estimates (`gpunet sim ... --estimates history --jobs-out JOBS.csv`).
Its `end_s` says when each completion was learned; its `submit_s` when each job was predicted.

1. Replays the predictor of `gpunet_core::Predictor` offline over those events (the levels a trace without users or
   job names has: the tenant's jobs of one GPU count, else the tenant's jobs, else all jobs; each an exponentially
   weighted mean of log run times) and variants of it: other weights, the median of the last k runs, the median of
   the jobs of the same class submitted within D seconds of the job (a sweep's siblings) that ended before it was
   predicted or before it first started. Prints, per job-size class, the mean absolute error of log10(estimate ÷
   run time) and the correlation of the logs (what an SRPT-like order needs).
2. With `--oracle ORACLE.csv` (the same replay with `--estimates oracle`): Jain's index over tenants of 1 ÷ mean
   bounded slowdown (as `gpunet sim` computes it) of the learned replay, and what it would be if the jobs of 5 or
   more GPUs that run at most T had waited as in the oracle replay, or not at all.

Usage: scripts/estimate-quality.py JOBS.csv [--oracle ORACLE.csv]
"""
import argparse
import bisect
import collections
import csv
import math

CLASSES = ["1", "2-4", "5-8", ">8"]


class Ewma:
    """The predictor's level: the plain mean of the first `w` logs, then weight 1/w."""

    def __init__(self, w):
        self.n, self.m, self.w = 0, 0.0, w

    def add(self, x):
        self.n += 1
        self.m += max(1 / self.n, 1 / self.w) * (x - self.m)

    def get(self):
        return self.m if self.n else None


class LastK:
    """The median of the last k logs."""

    def __init__(self, k):
        self.d = collections.deque(maxlen=k)

    def add(self, x):
        self.d.append(x)

    def get(self):
        if not self.d:
            return None
        v = sorted(self.d)
        return v[len(v) // 2]


def load(path):
    jobs = []
    for r in csv.DictReader(open(path)):
        jobs.append(dict(id=r["id"], tenant=r["tenant"], gpus=int(r["gpus"]), cls=r["size_class"],
                         submit=float(r["submit_s"]), dur=max(float(r["duration_s"]), 1.0),
                         end=float(r["end_s"]) if r["end_s"] else math.inf,
                         start=float(r["first_start_s"]) if r["first_start_s"] else math.inf,
                         done=r["end"] == "completed", wait=float(r["wait_s"])))
    return jobs


def levels(jobs, make, when):
    """Estimates (log seconds) of every job predicted at `when(job)` from completions before then."""
    ev = []
    for j in jobs:
        ev.append((when(j), 1, j))
        if j["done"]:
            ev.append((j["end"], 0, j))
    ev.sort(key=lambda e: (e[0], -e[1]))
    cls, ten, every = collections.defaultdict(make), collections.defaultdict(make), make()
    est = {}
    for _, kind, j in ev:
        if kind == 0:
            x = math.log(j["dur"])
            cls[(j["tenant"], j["gpus"])].add(x)
            ten[j["tenant"]].add(x)
            every.add(x)
            continue
        for s in (cls.get((j["tenant"], j["gpus"])), ten.get(j["tenant"]), every):
            if s is not None and s.get() is not None:
                est[j["id"]] = s.get()
                break
    return est


def siblings(jobs, window, when):
    """The class's jobs submitted within `window` s of the job that ended before `when(job)` (their median), else
    the predictor's estimate at that time."""
    est = levels(jobs, lambda: Ewma(8), when)
    by = collections.defaultdict(list)
    for j in jobs:
        by[(j["tenant"], j["gpus"])].append(j)
    for v in by.values():
        v.sort(key=lambda j: j["submit"])
        subs = [j["submit"] for j in v]
        for j in v:
            lo, hi = bisect.bisect_left(subs, j["submit"] - window), bisect.bisect_right(subs, j["submit"] + window)
            xs = sorted(math.log(o["dur"]) for o in v[lo:hi] if o is not j and o["done"] and o["end"] <= when(j))
            if xs:
                est[j["id"]] = xs[len(xs) // 2]
    return est


def score(jobs, est):
    cells = []
    for c in CLASSES:
        pairs = [(est[j["id"]], math.log(j["dur"])) for j in jobs if j["cls"] == c and j["id"] in est]
        if len(pairs) < 2:
            cells.append("-")
            continue
        n = len(pairs)
        mae = sum(abs(a - b) for a, b in pairs) / n / math.log(10)
        ma, mb = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
        cov = sum((a - ma) * (b - mb) for a, b in pairs)
        va, vb = sum((a - ma) ** 2 for a, _ in pairs), sum((b - mb) ** 2 for _, b in pairs)
        r = cov / math.sqrt(va * vb) if va > 0 and vb > 0 else 0.0
        cells.append(f"{mae:.2f} / {r:.2f}")
    return cells


def jain(jobs, wait):
    per = collections.defaultdict(list)
    for j in jobs:
        if j["done"]:
            d = j["dur"]
            per[j["tenant"]].append(max(1.0, (d + wait(j)) / max(d, 10.0)))
    xs = [1 / (sum(v) / len(v)) for v in per.values()]
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jobs", help="--jobs-out CSV of a replay with --estimates history")
    ap.add_argument("--oracle", help="--jobs-out CSV of the same replay with --estimates oracle")
    a = ap.parse_args()
    jobs = load(a.jobs)
    at_submit = lambda j: j["submit"]  # noqa: E731
    at_start = lambda j: min(j["start"], j["end"])  # noqa: E731
    variants = [
        ("weight 1/8 (the predictor)", levels(jobs, lambda: Ewma(8), at_submit)),
        ("weight 1/2", levels(jobs, lambda: Ewma(2), at_submit)),
        ("weight 1/4", levels(jobs, lambda: Ewma(4), at_submit)),
        ("weight 1/32", levels(jobs, lambda: Ewma(32), at_submit)),
        ("last run", levels(jobs, lambda: LastK(1), at_submit)),
        ("median of last 5", levels(jobs, lambda: LastK(5), at_submit)),
        ("median of last 21", levels(jobs, lambda: LastK(21), at_submit)),
        ("weight 1/8, at first start", levels(jobs, lambda: Ewma(8), at_start)),
    ]
    for w in (600, 3600, 6 * 3600):
        variants.append((f"siblings ±{w} s, at submission", siblings(jobs, w, at_submit)))
        variants.append((f"siblings ±{w} s, at first start", siblings(jobs, w, at_start)))
    print("| estimate | " + " | ".join(f"{c} GPUs" for c in CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    for name, est in variants:
        print(f"| {name} | " + " | ".join(score(jobs, est)) + " |")
    print("(each cell: mean |log10(estimate ÷ run time)| / correlation of the logs)")
    if a.oracle:
        oracle = {j["id"]: j for j in load(a.oracle)}
        print(f"\nJain's index of the learned replay: {jain(jobs, lambda j: j['wait']):.3f}")
        for t in (120, 600, 1800, 7200, math.inf):
            big_short = lambda j: j["gpus"] >= 5 and j["dur"] <= t  # noqa: E731
            as_oracle = jain(jobs, lambda j: oracle[j["id"]]["wait"] if big_short(j) else j["wait"])
            none = jain(jobs, lambda j: 0.0 if big_short(j) else j["wait"])
            print(f"jobs of >= 5 GPUs that run <= {t} s waiting as with exact estimates: {as_oracle:.3f}; "
                  f"not waiting: {none:.3f}")


if __name__ == "__main__":
    main()

"""Derives the two profile tables gpunet uses to give Pollux/Sia workload jobs a fixed-allocation duration.

Input: the Pollux artifact's per-application profiles (`simulator/traces/<app>/{scalability,validation-<bsz>}.csv` of
petuum/adaptdl, commit c793c70, Apache-2.0). Output:
  iterations.csv  - app,batch_size,iterations   (iterations to reach the end of the validation curve at that batch size)
  scalability.csv - app,num_nodes,num_replicas,local_bsz,step_time,sync_time   (unchanged rows, app column added)
Run: python3 derive.py <path to the traces directory>
"""
import csv, os, sys

src = sys.argv[1]
apps = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
with open("iterations.csv", "w", newline="") as it, open("scalability.csv", "w", newline="") as sc:
    wi, ws = csv.writer(it), csv.writer(sc)
    wi.writerow(["app", "batch_size", "iterations"])
    ws.writerow(["app", "num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"])
    for app in apps:
        d = os.path.join(src, app)
        for f in sorted(os.listdir(d)):
            if f.startswith("validation-") and f.endswith(".csv"):
                bsz = int(f[len("validation-"):-4])
                rows = list(csv.DictReader(open(os.path.join(d, f))))
                wi.writerow([app, bsz, int(rows[-1]["iteration"])])
        for r in csv.DictReader(open(os.path.join(d, "scalability.csv"))):
            ws.writerow([app, r["num_nodes"], r["num_replicas"], r["local_bsz"], r["step_time"], r["sync_time"]])

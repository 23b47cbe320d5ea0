#!/usr/bin/env bash
# `gpunet bench api` against two fresh `gpunet server`s (plain HTTP on loopback, SQLite under $TMPDIR) of two
# binaries, A and B, alternating ROUNDS times so both see the same machine load; every run uses A's client.
#   scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]
# Prints one JSON line per run: {"binary": "A"|"B", "round": n, "acknowledged", "submissions_per_s", "p50_ms", ...}.
set -euo pipefail
. "$(dirname "$0")/bench-servers.sh"
A=${1:?usage: scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]}
B=${2:?usage: scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]}
JOBS=${3:-20000}
CLIENTS=${4:-16}
ROUNDS=${5:-3}
bench_dir gpunet-bench-ab
trap bench_stop EXIT
bench_start "$A" 7191 "$DIR/a"
bench_start "$B" 7192 "$DIR/b"
bench_wait http://127.0.0.1:7191 "$DIR/a"
bench_wait http://127.0.0.1:7192 "$DIR/b"
for r in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    if [ $which = A ]; then port=7191; else port=7192; fi
    out=$("$A" bench api --server "http://127.0.0.1:$port" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" \
      --output json)
    echo "{\"binary\": \"$which\", \"round\": $r, ${out#\{}"
  done
done

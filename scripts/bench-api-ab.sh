#!/usr/bin/env bash
# `gpunet bench api` against two fresh `gpunet server`s (plain HTTP on loopback, SQLite under $TMPDIR) of two
# binaries, A and B, alternating ROUNDS times so both see the same machine load; every run uses A's client.
#   scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]
# Prints one JSON line per run: {"binary": "A"|"B", "round": n, "acknowledged", "submissions_per_s", "p50_ms", ...}.
set -euo pipefail
A=${1:?usage: scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]}
B=${2:?usage: scripts/bench-api-ab.sh BINARY_A BINARY_B [JOBS] [CLIENTS] [ROUNDS]}
JOBS=${3:-20000}
CLIENTS=${4:-16}
ROUNDS=${5:-3}
DIR=$(mktemp -d -p "${TMPDIR:-/var/tmp}" gpunet-bench-ab.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
ADMIN=bench-admin-$RANDOM$RANDOM
start() { # $1 binary, $2 port, $3 data dir
  "$1" server --data-dir "$3" --listen "127.0.0.1:$2" --admin-token "$ADMIN" --join-token "join-$ADMIN" \
    --max-queued-jobs-per-tenant 1000000 >"$3.log" 2>&1 &
  PIDS+=($!)
}
start "$A" 7191 "$DIR/a"
start "$B" 7192 "$DIR/b"
for which in a b; do
  if [ $which = a ]; then port=7191; else port=7192; fi
  for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 || { cat "$DIR/$which.log" >&2; exit 1; }
done
for r in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    if [ $which = A ]; then port=7191; else port=7192; fi
    out=$("$A" bench api --server "http://127.0.0.1:$port" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" \
      --output json)
    echo "{\"binary\": \"$which\", \"round\": $r, ${out#\{}"
  done
done

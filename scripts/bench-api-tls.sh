#!/usr/bin/env bash
# `gpunet bench api` with TLS off and on, against two fresh `gpunet server`s on loopback (one plain HTTP, one HTTPS
# with a private CA made here by openssl), alternating ROUNDS times so both see the same machine load.
#   scripts/bench-api-tls.sh [BINARY] [JOBS] [CLIENTS] [ROUNDS]
# Prints one JSON line per run: {"tls": bool, "round": n, "acknowledged", "submissions_per_s", "p50_ms", "p99_ms"}.
set -euo pipefail
BIN=${1:-target/release/gpunet}
JOBS=${2:-20000}
CLIENTS=${3:-32}
ROUNDS=${4:-2}
DIR=$(mktemp -d -p "${TMPDIR:-/var/tmp}" gpunet-bench-tls.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=bench CA" \
  -keyout "$DIR/ca.key" -out "$DIR/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$DIR/server.key" -out "$DIR/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$DIR/ext"
openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial -days 1 \
  -extfile "$DIR/ext" -out "$DIR/server.pem" 2>/dev/null
ADMIN=bench-admin-$RANDOM$RANDOM
start() { # $1 port, $2 data dir, rest: flags
  local port=$1 data=$2; shift 2
  "$BIN" server --data-dir "$data" --listen "127.0.0.1:$port" --admin-token "$ADMIN" --join-token "join-$ADMIN" \
    --max-queued-jobs-per-tenant 1000000 "$@" >"$data.log" 2>&1 &
  PIDS+=($!)
}
start 7181 "$DIR/plain"
start 7182 "$DIR/tls" --tls-cert "$DIR/server.pem" --tls-key "$DIR/server.key"
for url in http://127.0.0.1:7181 https://127.0.0.1:7182; do
  for _ in $(seq 1 300); do
    curl -fsS --cacert "$DIR/ca.pem" "$url/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
done
for r in $(seq 1 "$ROUNDS"); do
  for mode in plain tls; do
    if [ $mode = plain ]; then url=http://127.0.0.1:7181; tls=false; else url=https://127.0.0.1:7182; tls=true; fi
    out=$("$BIN" bench api --server "$url" --ca "$DIR/ca.pem" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" \
      --output json)
    echo "{\"tls\": $tls, \"round\": $r, ${out#\{}"
  done
done

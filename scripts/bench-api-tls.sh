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
. "$(dirname "$0")/bench-servers.sh"
bench_dir gpunet-bench-tls
trap bench_stop EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=bench CA" \
  -keyout "$DIR/ca.key" -out "$DIR/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$DIR/server.key" -out "$DIR/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$DIR/ext"
openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial -days 1 \
  -extfile "$DIR/ext" -out "$DIR/server.pem" 2>/dev/null
bench_start "$BIN" 7181 "$DIR/plain"
bench_start "$BIN" 7182 "$DIR/tls" --tls-cert "$DIR/server.pem" --tls-key "$DIR/server.key"
bench_wait http://127.0.0.1:7181 "$DIR/plain"
bench_wait https://127.0.0.1:7182 "$DIR/tls" --cacert "$DIR/ca.pem"
for r in $(seq 1 "$ROUNDS"); do
  for mode in plain tls; do
    if [ $mode = plain ]; then url=http://127.0.0.1:7181; tls=false; else url=https://127.0.0.1:7182; tls=true; fi
    out=$("$BIN" bench api --server "$url" --ca "$DIR/ca.pem" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" \
      --output json)
    echo "{\"tls\": $tls, \"round\": $r, ${out#\{}"
  done
done

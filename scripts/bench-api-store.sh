#!/usr/bin/env bash
# `gpunet bench api` against two fresh `gpunet server`s on loopback, one on SQLite (its data directory) and one on
# PostgreSQL (a private cluster made here with Debian's initdb/pg_ctl, as `nobody` when run as root, fsync on),
# alternating ROUNDS times so both see the same machine load.
#   scripts/bench-api-store.sh [BINARY] [JOBS] [CLIENTS] [ROUNDS]
# Prints one JSON line per run: {"store": "sqlite"|"postgres", "round": n, "acknowledged", "submissions_per_s",
# "p50_ms", "p99_ms"}.
set -euo pipefail
BIN=$(realpath "${1:-target/release/gpunet}")
JOBS=${2:-20000}
CLIENTS=${3:-32}
ROUNDS=${4:-2}
PGBIN=${GPUNET_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
DIR=$(mktemp -d -p "${TMPDIR:-/var/tmp}" gpunet-bench-store.XXXXXX)
chmod 755 "$DIR"
PIDS=()
as_pg() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; else "$@"; fi; }
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -f "$DIR/pg/data/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null 2>&1
  rm -rf "$DIR"
}
trap cleanup EXIT
mkdir "$DIR/pg"
[ "$(id -u)" = 0 ] && chown 65534:65534 "$DIR/pg"
PGPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg "$PGBIN/initdb" -D "$DIR/pg/data" -U gpunet -A trust -E UTF8 --locale=C >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/log" -w \
  -o "-p $PGPORT -k $DIR/pg -c listen_addresses=127.0.0.1" start >/dev/null
as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U gpunet gpunet
ADMIN=bench-admin-$RANDOM$RANDOM
start() { # $1 port, $2 data dir, rest: flags
  local port=$1 data=$2; shift 2
  "$BIN" server --data-dir "$data" --listen "127.0.0.1:$port" --admin-token "$ADMIN" --join-token "join-$ADMIN" \
    --max-queued-jobs-per-tenant 1000000 "$@" >"$data.log" 2>&1 &
  PIDS+=($!)
}
start 7183 "$DIR/sqlite"
start 7184 "$DIR/postgres" --store "postgres://gpunet@127.0.0.1:$PGPORT/gpunet"
for url in http://127.0.0.1:7183 http://127.0.0.1:7184; do
  for _ in $(seq 1 300); do
    curl -fsS "$url/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
done
for r in $(seq 1 "$ROUNDS"); do
  for store in sqlite postgres; do
    if [ $store = sqlite ]; then url=http://127.0.0.1:7183; else url=http://127.0.0.1:7184; fi
    out=$("$BIN" bench api --server "$url" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" --output json)
    echo "{\"store\": \"$store\", \"round\": $r, ${out#\{}"
  done
done

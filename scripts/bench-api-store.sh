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
. "$(dirname "$0")/bench-servers.sh"
bench_dir gpunet-bench-store
chmod 755 "$DIR"
as_pg() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; else "$@"; fi; }
cleanup() {
  bench_kill
  [ -f "$DIR/pg/data/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null 2>&1
  bench_stop
}
trap cleanup EXIT
mkdir "$DIR/pg"
[ "$(id -u)" = 0 ] && chown 65534:65534 "$DIR/pg"
PGPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg "$PGBIN/initdb" -D "$DIR/pg/data" -U gpunet -A trust -E UTF8 --locale=C >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/log" -w \
  -o "-p $PGPORT -k $DIR/pg -c listen_addresses=127.0.0.1" start >/dev/null
as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U gpunet gpunet
bench_start "$BIN" 7183 "$DIR/sqlite"
bench_start "$BIN" 7184 "$DIR/postgres" --store "postgres://gpunet@127.0.0.1:$PGPORT/gpunet"
bench_wait http://127.0.0.1:7183 "$DIR/sqlite"
bench_wait http://127.0.0.1:7184 "$DIR/postgres"
for r in $(seq 1 "$ROUNDS"); do
  for store in sqlite postgres; do
    if [ $store = sqlite ]; then url=http://127.0.0.1:7183; else url=http://127.0.0.1:7184; fi
    out=$("$BIN" bench api --server "$url" --token "$ADMIN" --jobs "$JOBS" --clients "$CLIENTS" --output json)
    echo "{\"store\": \"$store\", \"round\": $r, ${out#\{}"
  done
done

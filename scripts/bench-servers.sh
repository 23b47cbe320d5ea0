# Sourced by the `bench api` scripts (bench-api-tls.sh, bench-api-store.sh, bench-api-ab.sh): fresh `gpunet server`s
# on loopback under one temporary directory, stopped and removed when the script exits.
#   bench_dir NAME            makes $DIR (under $TMPDIR, else /var/tmp) and $ADMIN, the servers' admin token
#   bench_start BIN PORT DATA [FLAGS…]   starts a server on 127.0.0.1:PORT with its data in DATA, its log DATA.log
#   bench_wait URL DATA [CURL ARGS…]     waits for the server's health; fails with its log if it never answers
#   bench_kill                stops the servers
#   bench_stop                stops the servers and removes $DIR (call it from the script's EXIT trap)
PIDS=()
bench_dir() {
  DIR=$(mktemp -d -p "${TMPDIR:-/var/tmp}" "$1.XXXXXX")
  ADMIN=bench-admin-$RANDOM$RANDOM
}
bench_start() {
  local bin=$1 port=$2 data=$3
  shift 3
  "$bin" server --data-dir "$data" --listen "127.0.0.1:$port" --admin-token "$ADMIN" --join-token "join-$ADMIN" \
    --max-queued-jobs-per-tenant 1000000 "$@" >"$data.log" 2>&1 &
  PIDS+=($!)
}
bench_wait() {
  local url=$1 data=$2
  shift 2
  for _ in $(seq 1 300); do
    curl -fsS "$@" "$url/v1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the server at $url did not start:" >&2
  cat "$data.log" >&2
  return 1
}
bench_kill() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}
bench_stop() {
  bench_kill
  rm -rf "$DIR"
}

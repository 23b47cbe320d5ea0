#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/fuzz_targets for SECONDS each (default 20) and fails if any finds a crash
# (panic, failed assertion, overflow, more than 2 GiB of memory, an input taking over 10 s).
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`); .ci/run installs both.
# The committed seeds (fuzz/seeds/<target>/) are copied into target/fuzz-corpus/<target>/, where libFuzzer adds what
# it finds, so nothing it writes is committed; builds go to target/fuzz, crashing inputs to target/fuzz-artifacts.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
root=$PWD
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
# Debug assertions on (-a): integer overflow panics here instead of wrapping silently as in a release build.
fuzz() {
  local sub=$1
  shift
  cargo +nightly fuzz "$sub" --fuzz-dir "$root/fuzz" --target-dir "$root/target/fuzz" -a "$@"
}
start=$(date +%s)
fuzz build
echo "fuzz: built ${#targets[@]} targets in $(($(date +%s) - start)) s"
failed=()
for t in "${targets[@]}"; do
  corpus=$root/target/fuzz-corpus/$t
  artifacts=$root/target/fuzz-artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  cp -n fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz: $t for $secs s"
  if ! fuzz run "$t" "$corpus" -- -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 2>"$root/target/fuzz-$t.log"; then
    tail -40 "$root/target/fuzz-$t.log" >&2
    failed+=("$t")
  else
    grep -E "^stat::number_of_executed_units|^Done " "$root/target/fuzz-$t.log" || true
  fi
done
echo "fuzz: ${#targets[@]} targets in $(($(date +%s) - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (inputs in target/fuzz-artifacts/<target>/, logs in target/fuzz-<target>.log)" >&2
  exit 1
fi

#!/usr/bin/env bash
# One-shot check on a machine with NVIDIA GPUs: `gpunet up` discovers them through NVML (model, memory, UUID, MIG
# mode), a 1-GPU job running `nvidia-smi -L` sees exactly its GPU, and /metrics carries NVML samples.
# Usage: scripts/device-check.sh [path/to/gpunet]   (default target/release/gpunet). Writes to ${OUT:-/tmp/gpunet-device}.
set -uo pipefail
BIN=${1:-target/release/gpunet}
OUT=${OUT:-/tmp/gpunet-device}
mkdir -p "$OUT"
DATA=$(mktemp -d)
PORT=7391
URL=http://127.0.0.1:$PORT
nvidia-smi -L > "$OUT/host-nvidia-smi-L.txt" 2>&1 || true
nvidia-smi --query-gpu=index,name,uuid,memory.total,mig.mode.current --format=csv > "$OUT/host-gpus.csv" 2>&1 || true
"$BIN" up --data-dir "$DATA" --listen 127.0.0.1:$PORT > "$OUT/up.stdout" 2> "$OUT/up.stderr" &
UP=$!
trap 'kill -INT $UP 2>/dev/null; sleep 2; kill $UP 2>/dev/null' EXIT
for _ in $(seq 1 100); do grep -q "gpunet is up" "$OUT/up.stdout" 2>/dev/null && break; sleep 0.2; done
TOKEN=$(cat "$DATA/admin.token")
export GPUNET_SERVER=$URL GPUNET_TOKEN=$TOKEN
sleep 2
curl -sf -H "Authorization: Bearer $TOKEN" "$URL/v1/nodes" > "$OUT/nodes.json"
ID=$("$BIN" submit --tenant default --gpus 1 --output json -- sh -c 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L' | grep -o '"id": *[0-9]*' | head -1 | grep -o '[0-9]*$')
for _ in $(seq 1 150); do
  S=$("$BIN" show "$ID" --output json | grep -o '"state": *"[a-z]*"' | head -1 | grep -o '[a-z]*"$' | tr -d '"')
  case "$S" in succeeded|failed|cancelled) break ;; esac
  sleep 0.2
done
echo "job $ID: $S" > "$OUT/job.txt"
"$BIN" logs "$ID" >> "$OUT/job.txt" 2>&1
sleep 6   # one NVML sample period
curl -sf -H "Authorization: Bearer $TOKEN" "$URL/metrics" | grep -E '^gpunet_gpu_' > "$OUT/gpu-metrics.txt"
echo "== up"; cat "$OUT/up.stdout"
echo "== host"; cat "$OUT/host-nvidia-smi-L.txt" "$OUT/host-gpus.csv"
echo "== job"; cat "$OUT/job.txt"
echo "== metrics"; head -40 "$OUT/gpu-metrics.txt"
grep -q '"fake":false' "$OUT/nodes.json" && [ "$S" = succeeded ] && [ "$(grep -c '^GPU ' "$OUT/job.txt")" = 1 ]

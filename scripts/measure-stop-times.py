#!/usr/bin/env python3
"""Measures how long a training process takes to stop after SIGTERM when its handler writes a checkpoint.

For each model (parameter counts from the models' papers) a child process holds the model's training state in memory
-- fp32 weights plus Adam's two moments, 12 bytes per parameter -- and, on SIGTERM, writes it to DIR, fsyncs and exits,
as a PyTorch job's `torch.save(...)` handler does. The parent sends SIGTERM once the child is ready and measures the
time until the child has exited (what gpunet's lifecycle waits for before it frees a victim's GPUs).

    scripts/measure-stop-times.py DIR [REPEATS] > data/stop-times/checkpoint-on-sigterm.csv

Output: CSV `model,params,bytes,seconds`, one row per run.
"""
import os
import signal
import subprocess
import sys
import time

MODELS = [  # (name, parameters)
    ("resnet18", 11_700_000),  # He et al. 2016
    ("resnet50", 25_600_000),  # He et al. 2016
    ("vit-b16", 86_000_000),  # Dosovitskiy et al. 2021
    ("bert-base", 110_000_000),  # Devlin et al. 2019
    ("gpt2-small", 124_000_000),  # Radford et al. 2019
    ("bert-large", 340_000_000),  # Devlin et al. 2019
    ("gpt2-medium", 355_000_000),  # Radford et al. 2019
]
BYTES_PER_PARAM = 12  # fp32 weights + Adam's first and second moments

CHILD = r"""
import os, signal, sys
path, size = sys.argv[1], int(sys.argv[2])
state = bytearray(size)
for i in range(0, size, 4096):  # touch every page, as trained weights are
    state[i] = 1
def save(signum, frame):
    with open(path, "wb") as f:
        f.write(state)
        f.flush()
        os.fsync(f.fileno())
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
signal.pause()
"""


def main():
    out_dir = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.makedirs(out_dir, exist_ok=True)
    print("model,params,bytes,seconds")
    for r in range(repeats):
        for name, params in MODELS:
            size = params * BYTES_PER_PARAM
            path = os.path.join(out_dir, f"{name}.ckpt")
            p = subprocess.Popen([sys.executable, "-c", CHILD, path, str(size)], stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            t = time.monotonic()
            p.send_signal(signal.SIGTERM)
            rc = p.wait()
            dt = time.monotonic() - t
            assert rc == 0, f"{name}: exit {rc}"
            os.remove(path)
            print(f"{name},{params},{size},{dt:.3f}", flush=True)


if __name__ == "__main__":
    main()

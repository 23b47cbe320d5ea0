#!/usr/bin/env bash
# `gpunet bench e2e` on a freshly made ext4 file system (a loop-mounted image, no journal by default, like this
# project's CI machines' root), so that runs compare: on ext4 without a journal every new inode scans past the
# inodes deleted in the last minute or more (the kernel's `recently_deleted`), so on a disk that earlier runs
# filled with deleted files a task start costs more and more, run after run.
#   sudo scripts/bench-e2e-fresh.sh BINARY [BENCH ARGS…]      (root: mkfs, mount)
# e.g. scripts/bench-e2e-fresh.sh target/release/gpunet --jobs 1000 --tenant-uids
# MKFS_OPTS (default "-O ^has_journal") and IMAGE_DIR (default /var/tmp) may be set. Prints the bench's table on
# one line, then the CPU it used (user+system seconds, the agent's tasks included).
set -euo pipefail
BIN=$(realpath "${1:?usage: $0 BINARY [BENCH ARGS...]}")
shift
IMG=$(mktemp -p "${IMAGE_DIR:-/var/tmp}" gpunet-fresh.XXXXXX.img)
MNT=$(mktemp -d -p "${IMAGE_DIR:-/var/tmp}" gpunet-fresh.XXXXXX)
cleanup() { umount "$MNT" 2>/dev/null || true; rm -rf "$IMG" "$MNT"; }
trap cleanup EXIT
truncate -s 3G "$IMG"
# shellcheck disable=SC2086
mkfs.ext4 -q -F ${MKFS_OPTS--O ^has_journal} "$IMG"
mount -o loop "$IMG" "$MNT"
chmod 1777 "$MNT"
TMPDIR=$MNT /usr/bin/time -f "cpu_s %U+%S" "$BIN" bench e2e "$@" 2>&1 | tr -s ' \n' ' '
echo

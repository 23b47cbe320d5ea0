#!/usr/bin/env bash
# Builds the small test images offline from a static busybox (Debian's busybox-static), in DIR (default
# ./images): `DIR/tiny`, an unpacked root filesystem (run it as `image: dir:tiny`), and with umoci installed the OCI
# layout `DIR/lay` tagged 1 (`image: oci:lay:1`), whose own command prints where it runs.
# Then: gpunet agent --image-dir DIR …, or gpunet bench e2e --image dir:tiny --image-dir DIR.
set -euo pipefail
dir=${1:-images}
busybox=$(command -v busybox) || { echo "busybox not found (apt-get install busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
  echo "$busybox is dynamically linked: a container needs a static one (apt-get install busybox-static)" >&2
  exit 1
fi
rm -rf "$dir/tiny" "$dir/lay" "$dir/lay-bundle"
mkdir -p "$dir/tiny"/{bin,etc,tmp,proc,dev,sys,work}
cp "$busybox" "$dir/tiny/bin/busybox"
for a in $("$dir/tiny/bin/busybox" --list); do
  [ "$a" = busybox ] || ln -s busybox "$dir/tiny/bin/$a"
done
echo 'root:x:0:0:root:/:/bin/sh' > "$dir/tiny/etc/passwd"
if command -v umoci >/dev/null; then
  umoci init --layout "$dir/lay"
  umoci new --image "$dir/lay:1"
  umoci unpack --image "$dir/lay:1" "$dir/lay-bundle"
  cp -a "$dir/tiny/." "$dir/lay-bundle/rootfs/"
  umoci repack --image "$dir/lay:1" "$dir/lay-bundle"
  umoci config --image "$dir/lay:1" --config.env PATH=/bin:/sbin --config.workingdir /work \
    --config.cmd sh --config.cmd -c --config.cmd 'echo image-default in $(pwd) PATH=$PATH'
  rm -rf "$dir/lay-bundle"
fi
echo "built $dir/tiny$(command -v umoci >/dev/null && echo " and $dir/lay:1")"

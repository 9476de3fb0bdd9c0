#!/usr/bin/env bash
# The Vulkan backend's cooperative-matrix tests on a device that has VK_KHR_cooperative_matrix:
# Mesa 26's lavapipe (8x8x8 f16 shapes, emulated on the CPU), from Debian trixie-backports.
# Debian 12's Mesa 22 has no cooperative matrices, and Mesa 26 needs glibc 2.39, so it cannot
# load into a process of Debian 12: the test binaries are built here and run in a Debian 13
# root kept in the cache (debootstrap, once per machine: about 3 minutes and 400 MB).
# Needs root (debootstrap, chroot, bind mounts); elsewhere it says so and exits 0.
#   scripts/test-coop-lavapipe.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tinyllm/target}"
root="${TINYLLM_TRIXIE_ROOT:-$HOME/.cache/tinyllm/trixie-root}"
if [ "$(id -u)" != 0 ]; then
  echo "test-coop-lavapipe: needs root (debootstrap, chroot); not run"
  exit 0
fi
if [ ! -f "$root/.tinyllm-ready" ]; then
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
  rm -rf "$root"
  debootstrap --variant=minbase --include=libvulkan1,ca-certificates trixie "$root" http://deb.debian.org/debian
  cat > "$root/etc/apt/sources.list" <<'EOF'
deb http://deb.debian.org/debian trixie main
deb http://deb.debian.org/debian trixie-backports main
EOF
  chroot "$root" apt-get update -q
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -t trixie-backports mesa-vulkan-drivers
  touch "$root/.tinyllm-ready"
fi
# The test binaries, built on this system as scripts/test.sh builds them (the whole workspace,
# so cargo's feature resolution and the binaries are the same), run in the root.
bins=$(cargo test --workspace --release --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if exe and os.path.basename(exe).split("-")[0] in ("backend_ops", "vulkan_golden"):
        print(exe)')
[ -n "$bins" ] || { echo "test-coop-lavapipe: no test binaries" >&2; exit 1; }
mounted=()
cleanup() {
  # Lazy: a test still running in the root (the script killed) keeps its mounts busy.
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
for dir in "$repo" "$CARGO_TARGET_DIR" /proc; do
  mkdir -p "$root$dir"
  if ! mountpoint -q "$root$dir"; then
    if [ "$dir" = /proc ]; then mount -t proc proc "$root/proc"; else mount --bind "$dir" "$root$dir"; fi
    mounted+=("$root$dir")
  fi
done
chroot "$root" sh -c "ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null"
status=0
for bin in $bins; do
  # A device without cooperative matrices fails these tests instead of skipping them.
  chroot "$root" env TINYLLM_REQUIRE_GPU=1 TINYLLM_REQUIRE_COOP=1 HOME="$HOME" sh -c "cd '$repo' && '$bin' cooperative --test-threads 1 --nocapture" ||
    status=$?
done
exit "$status"

#!/usr/bin/env bash
# The .deb on a fresh Debian 12: debootstraps a minimal bookworm (cached in $FSDP_DEB_ROOT, default
# /var/tmp/fsdp-deb12; root needed), installs build/fsdp-cpp_*.deb there with apt (which brings
# its Debian dependencies), and runs the main job from the installed package at 2 ranks, with
# nothing of the build machine visible (no .venv/, no build/). Not part of CI (about 5 minutes
# the first time, mostly downloads). Usage: bash scripts/make-deb.sh && bash scripts/test-deb.sh
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deb=$(ls "$root_dir"/build/fsdp-cpp_*_amd64.deb 2>/dev/null | tail -1)
[ -n "$deb" ] || { echo "test-deb: no build/fsdp-cpp_*_amd64.deb (bash scripts/make-deb.sh)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "test-deb: needs root (debootstrap, chroot)" >&2; exit 1; }
chroot_dir=${FSDP_DEB_ROOT:-/var/tmp/fsdp-deb12}
if [ ! -x "$chroot_dir/usr/bin/apt-get" ]; then
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap > /dev/null
  echo "test-deb: debootstrap bookworm into $chroot_dir"
  debootstrap --variant=minbase bookworm "$chroot_dir" http://deb.debian.org/debian > /tmp/test-deb-debootstrap.log
fi
mount -t proc proc "$chroot_dir/proc"
mount -t sysfs sysfs "$chroot_dir/sys"   # hwloc (Open MPI) reads the CPU topology there
trap 'umount "$chroot_dir/proc" "$chroot_dir/sys" 2>/dev/null || true' EXIT
cp "$deb" "$chroot_dir/tmp/"
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
start=$(date +%s)
chroot "$chroot_dir" /bin/bash -euo pipefail -c "
  export DEBIAN_FRONTEND=noninteractive
  dpkg -s fsdp-cpp > /dev/null 2>&1 && apt-get remove -y -q fsdp-cpp > /dev/null
  apt-get update -q > /dev/null
  apt-get install -y -q --no-install-recommends /tmp/$(basename "$deb") > /tmp/apt.log 2>&1 || { tail -n 30 /tmp/apt.log; exit 1; }
  echo \"test-deb: installed \$(dpkg -s fsdp-cpp | grep ^Version) with \$(grep -c '^Setting up' /tmp/apt.log) packages\"
  ls /usr/lib/fsdp-cpp
  ! ls /work 2>/dev/null   # nothing of the build machine
  cd /tmp && rm -rf run
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none -np 2 \
    fsdp-train /usr/share/fsdp/configs/gpt-fortunes-tiny.toml --steps 60 --output-dir /tmp/run --progress lines | grep -E '^(fsdp-train|done|eval)'
  ls /tmp/run
  fsdp-report /tmp/run > /dev/null
  fsdp-plan --model llama3-8b --ranks 8 --memory 80GB --compact
"
echo "test-deb: the package installed and ran the main job on a fresh Debian 12 in $(( $(date +%s) - start )) s"

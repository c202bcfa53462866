#!/usr/bin/env bash
# The Debian packages fsdp.cpp builds against that a GPU machine's image may lack (Open MPI, its
# libraries, toml++, CLI11, nlohmann-json, GoogleTest, zlib's headers, tcmalloc), downloaded here as .deb
# files into .gpu-deps/ (ignored by git, about 9 MB) for a machine that cannot reach a package
# registry. scripts/gpu-check.sh unpacks them under /tmp there (never into /) when mpicxx is
# missing, and points the build and mpirun at them (OPAL_PREFIX relocates Open MPI).
#
#   bash scripts/gpu-deps.sh            # here, on Debian 12 with apt
#   then carry .gpu-deps with the device call that runs scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  # Open MPI 4.1: headers and compiler wrappers, mpirun, its plugins and help files, and the
  # libraries they load (a CUDA image has none of them).
  libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm-infinipath1 libpsm2-2
  libnl-3-200 libnl-route-3-200 libmunge2 libnuma1 libltdl7 libxnvctrl0 libgfortran5
  # The libraries the build links or includes.
  libtomlplusplus3 libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libgtest-dev zlib1g zlib1g-dev
  libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 libtcmalloc-minimal4
)
mkdir -p .gpu-deps
# apt's sandbox user must be able to write there; as root without it, apt warns and goes on.
(cd .gpu-deps && apt-get download "${packages[@]}")
echo "gpu-deps: $(ls .gpu-deps/*.deb | wc -l) packages, $(du -sh .gpu-deps | cut -f1) in .gpu-deps/"

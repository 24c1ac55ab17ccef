#!/usr/bin/env bash
# Install every Debian 12 package kvidx needs to build, test, benchmark and
# profile. Idempotent: packages already present are skipped, and apt is not
# touched at all when nothing is missing. Run as root.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git
  liburcu-dev libzmq3-dev libmsgpack-dev libxxhash-dev
  libh2o-evloop-dev libssl-dev libjemalloc-dev libcmocka-dev
  libcurl4-openssl-dev curl nghttp2-client
  nats-server libnats-dev libprotobuf-c1 zlib1g-dev
  clang libclang-rt-14-dev
  python3 python3-xxhash python3-msgpack python3-zmq
  gnuplot-nox
)
# `ci/deps.sh profile` also installs the profiling tools (perf/profile.sh).
if [ "${1:-}" = "profile" ]; then
  PKGS+=(linux-perf valgrind)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

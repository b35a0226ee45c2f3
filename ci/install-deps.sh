#!/usr/bin/env bash
# Install the Debian packages tern builds and tests with. Idempotent: does
# nothing (and needs no network) when everything is already installed.
set -euo pipefail

packages=(
    build-essential cmake pkg-config g++      # toolchain; g++ compiles the headers as C++
    libhwloc-dev hwloc                        # topology for the worker pool
    libibverbs-dev librdmacm-dev              # verbs provider (TERN_WITH_VERBS)
    libucx-dev ucx-utils                      # UCX provider (TERN_WITH_UCX), ucx_perftest
    libcmocka-dev uthash-dev                  # unit tests; the store's hash table
    libdlpack-dev                             # DLPack interchange (tensor/)
    clang-14 libclang-rt-14-dev               # libFuzzer for the fuzz tests
    openmpi-bin libopenmpi-dev                # mpirun launch tests and the MPI peer in perf/
    iproute2 procps                           # network namespaces in tests; pgrep/kill
    gnuplot-nox                               # perf/plot_coll.sh: the collectives' busbw plot
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

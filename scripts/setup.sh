#!/usr/bin/env bash
# Installs what the build needs (Debian/Ubuntu; root or sudo) where it is missing, then
# configures and builds everything into ./build. CUDA (nvcc) and NCCL must already be present.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
[ -d /usr/include/gtest ] || need+=(libgtest-dev libgmock-dev)
command -v cmake >/dev/null || need+=(cmake)
command -v clang-format >/dev/null || need+=(clang-format)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${SWIFTQK_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"

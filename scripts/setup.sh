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
# The PyTorch extension is built where torch is importable (pip install --no-build-isolation .
# installs it as a package instead).
py_args=()
if python3 -c 'import torch' 2>/dev/null; then
  py_args=(-DSWIFTQK_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)")
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${py_args[@]}" ${SWIFTQK_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"

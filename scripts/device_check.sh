#!/usr/bin/env bash
# One device-machine session: GPU tests, then the benchmark sweep and the PyTorch baseline, all
# against a build folder carried from the CPU machine (fallback: build there). Full logs go to
# $OUT (or ./device_out); a short table is printed last.
#   bash scripts/device_check.sh [tests|bench|all] [extra bench args...]
set -uo pipefail
what=${1:-all}
shift || true
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
# NCCL comes with PyTorch's wheels on the GPU machine; the toolkit there may lack it.
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null)
[ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
commit=$(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
if ! ./build/tests/swiftqk_gpu_tests --gtest_list_tests >/dev/null 2>&1; then
  echo "carried build does not run here: rebuilding"
  cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 && cmake --build build -j16 >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  # The IPC worker path was baked in at build time; point it at this tree.
  (cd build/tests && ./swiftqk_gpu_tests --gtest_brief=1 2>&1 | tee "$OUT/gpu_tests.log" | tail -40) || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  ./build/bench/swiftqk_bench --commit "$commit" --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" || rc=1
fi
exit $rc

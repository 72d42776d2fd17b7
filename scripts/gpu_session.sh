#!/usr/bin/env bash
# One call on a GPU machine that checks and measures everything at once (the device time of a
# session is short): GPU gtests, the Python GPU tests, the benchmark (SwiftQK against the
# MiniMax-fused baseline with virtual ranks, and the precision rows for bf16 and fp8), the
# PyTorch baseline and a short decode run. Logs and JSON go to $OUT (default ./gpu_out); a
# summary is printed last.
#   bash scripts/gpu_session.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:${LD_LIBRARY_PATH:-}"
commit=$(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -x build/tests/swiftqk_gpu_tests ] || ! build/tests/swiftqk_gpu_tests --gtest_list_tests >/dev/null 2>&1; then
  cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=90 -DSWIFTQK_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1
  cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi
summary=()
build/tests/swiftqk_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
summary+=("gpu gtests: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/gpu_tests.log" | tr '\n' ' ')")
if python3 -c 'import swiftqk' 2>/dev/null || [ -f python/swiftqk/_C*.so ]; then
  timeout 600 python3 -m pytest -q tests/python >"$OUT/pytest.log" 2>&1
  summary+=("pytest: $(tail -1 "$OUT/pytest.log")")
fi
[ "${1:-}" = quick ] && { printf '%s\n' "${summary[@]}"; exit 0; }
build/bench/swiftqk_bench --methods swiftqk,minimax_fused --tokens 1,64,4096,16384 --tp 1,2,4,8 \
  --iters 60 --commit "$commit" --json "$OUT/bench_methods.json" >"$OUT/bench_methods.log" 2>&1
summary+=("bench methods: $(tail -1 "$OUT/bench_methods.log")")
build/bench/swiftqk_bench --dtype bf16,fp8 --methods swiftqk,minimax_fused,all_gather --tp 1 \
  --tokens 4096 --iters 20 --commit "$commit" --json "$OUT/bench_precision.json" \
  >"$OUT/bench_precision.log" 2>&1
summary+=("bench precision: $(tail -1 "$OUT/bench_precision.log")")
python3 bench/precision_table.py "$OUT/bench_precision.json" >"$OUT/precision.md" 2>&1
summary+=("precision: $(tail -1 "$OUT/precision.md")")
python3 bench/torch_rms_norm.py --iters 100 --json "$OUT/torch.json" \
  --swiftqk-json "$OUT/bench_methods.json" >"$OUT/torch.log" 2>&1
summary+=("torch: $(tail -1 "$OUT/torch.log")")
timeout 300 python3 bench/e2e_decode.py --model olmo2-13b --layers 8 --batch 1,32,256 \
  --context 512,4096 --iters 30 --json "$OUT/e2e.json" >"$OUT/e2e.log" 2>&1
summary+=("e2e: $(tail -1 "$OUT/e2e.log")")
printf '%s\n' "${summary[@]}"

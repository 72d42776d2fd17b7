#!/usr/bin/env bash
# The main job: set up, build, then verify and time SwiftQK on the GPUs present (TP > 1 as
# virtual ranks on one GPU; with several GPUs also one process per GPU against the baselines). Without a GPU it says so and runs the float64 reference self-check.
# Results: bench/results/latest.json (and latest_torch.json when PyTorch is there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "$(nvidia-smi -L 2>/dev/null)" ]; then
  echo "main.sh: no NVIDIA GPU on this machine; GPU tests and timings cannot run here."
  exec ./build/bench/swiftqk_bench
fi
# NCCL may come only with PyTorch's wheels on GPU machines.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:${LD_LIBRARY_PATH:-}"
commit=$(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null || echo unknown)
./build/tests/swiftqk_gpu_tests --gtest_brief=1
./build/bench/swiftqk_bench --commit "$commit" --json bench/results/latest.json "$@"
# Virtual ranks against their own TP 1: the scaling targets, counted (docs/results.md).
python3 bench/tp_scaling_table.py --summary "virtual ranks=bench/results/latest.json"
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -gt 1 ]; then  # one process per GPU: real inter-GPU exchange, every method
  ./build/bench/swiftqk_bench --procs "$ngpu" --commit "$commit" \
    --methods swiftqk,minimax_fused,all_gather,comm_overlap,minimax_eager \
    --json bench/results/latest_procs.json "$@"
fi
if python3 -c 'import torch' 2>/dev/null; then
  python3 bench/torch_rms_norm.py --json bench/results/latest_torch.json \
    --swiftqk-json bench/results/latest.json
fi

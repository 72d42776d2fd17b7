#!/usr/bin/env bash
# The main job: set up, build, then verify and time SwiftQK on the GPUs present (TP > 1 as
# virtual ranks on one GPU; with several GPUs also one process per GPU against the baselines).
# Without a GPU it says so and runs the float64 reference self-check.
# Extra arguments go to the benchmark on every machine (a bad one stops it with a message).
# Results: results/latest.json, latest_epilogue.json and latest_faults.json (latest_procs.json
# with several GPUs, latest_torch.json when PyTorch is there; on an H200 compare_baseline.md, the
# run against bench/baselines/h200.json), in the git-ignored folder results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "$(nvidia-smi -L 2>/dev/null)" ]; then
  echo "main.sh: no NVIDIA GPU on this machine; GPU tests and timings cannot run here."
  # The arguments still go to the benchmark, which checks them before its reference self-check.
  exec ./build/bench/swiftqk_bench "$@"
fi
# NCCL may come only with PyTorch's wheels on GPU machines.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:${LD_LIBRARY_PATH:-}"
commit=$(git rev-parse HEAD 2>/dev/null || cat .commit 2>/dev/null || echo unknown)
mkdir -p results
# The arguments are checked (and the run stops on a bad one) before the GPU tests take minutes.
./build/bench/swiftqk_bench "$@" --list-models >/dev/null
./build/tests/swiftqk_gpu_tests --gtest_brief=1
# The failure scenarios: what the caller sees, how fast, and every output classified.
./build/bench/swiftqk_fault_report --json results/latest_faults.json
./build/bench/swiftqk_bench --commit "$commit" --json results/latest.json "$@"
# Virtual ranks against their own TP 1: the scaling targets, counted (docs/performance.md).
python3 bench/tp_scaling_table.py --summary "virtual ranks=results/latest.json"
# On an H200, against the rows behind docs/performance.md (bench/baselines/h200.json).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep H200 >/dev/null; then
  python3 bench/compare_baseline.py results/latest.json --set virtual_ranks \
    >results/compare_baseline.md || true
  echo "against bench/baselines/h200.json (table: results/compare_baseline.md):"
  tail -n 2 results/compare_baseline.md
fi
# The fused QK epilogue against the unfused chain, each point verified first (the extra
# arguments are swiftqk_bench's, so they do not go here).
./build/bench/swiftqk_epilogue_bench --tokens 1,64,4096 --tp 1,2,8 --cache bf16 --commit "$commit" \
  --json results/latest_epilogue.json
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -gt 1 ]; then  # one process per GPU: real inter-GPU exchange, every method
  ./build/bench/swiftqk_bench --procs "$ngpu" --commit "$commit" \
    --methods swiftqk,minimax_fused,all_gather,comm_overlap,minimax_eager \
    --json results/latest_procs.json "$@"
fi
if python3 -c 'import torch' 2>/dev/null; then
  python3 bench/torch_rms_norm.py --json results/latest_torch.json \
    --swiftqk-json results/latest.json
fi

#!/usr/bin/env bash
# Checks and measures SwiftQK on a GPU machine in one go; a summary is printed last.
#   bash scripts/gpu_check.sh verify    GPU gtests (multi-GPU ones too), the Python tests, and
#                                         with several GPUs the one-process-per-GPU sweep of all
#                                         five methods and the TP decode run
#   bash scripts/gpu_check.sh sweep     the one-process-per-GPU sweep and its precision run alone
#   bash scripts/gpu_check.sh decode    the TP decode runs alone (with and without the fused
#                                         epilogue) and transformers_tp.py, stock TP against ours
#   bash scripts/gpu_check.sh measure   virtual ranks against MiniMax fused, the precision
#                                         study, the PyTorch baseline, TP-1 decode, sanitizers
#   bash scripts/gpu_check.sh sanitize  compute-sanitizer memcheck, racecheck and synccheck on a
#                                         subset covering every kernel, TP 2 included (peer waits
#                                         scaled by SWIFTQK_TEST_WAIT_SCALE, default 30)
#   bash scripts/gpu_check.sh           verify and measure
# The sweep and the decode run use one process per GPU at the TPs in TPS (default: every power of
# two up to the GPU count, e.g. TPS="2 4"). Logs and JSON go to $OUT (default ./results, which git
# ignores); $OUT/summary.txt is rewritten after every step, so a run stopped part-way keeps the
# summary of the steps that finished. The PyTorch extension is built (in build-py) when
# python/swiftqk has none that imports.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
case "$phase" in
  all | verify | sweep | decode | measure | sanitize) ;;
  *) echo "gpu_check.sh: unknown phase '$phase' (all, verify, sweep, decode, measure, sanitize)" >&2
     exit 2 ;;
esac
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
summary=()
note() { summary+=("$1"); printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"; }
export PYTHONUNBUFFERED=1
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl:${LD_LIBRARY_PATH:-}"
commit=$(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
ngpu=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m; } \
  >"$OUT/gpu.txt" 2>&1
note "commit $commit, $ngpu GPU(s): $(head -1 "$OUT/gpu.txt")"
# One process per GPU at every TP the machine allows (TPS="2 4" to choose), for the sweep and decode.
tps=${TPS:-}; if [ -z "$tps" ]; then t=2; while [ "$t" -le "$ngpu" ]; do tps+="$t "; t=$((t * 2)); done; fi
if [ ! -x build/tests/swiftqk_gpu_tests ] || ! build/tests/swiftqk_gpu_tests --gtest_list_tests >/dev/null 2>&1; then
  cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1
  cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi
has_ext() { PYTHONPATH=python python3 -c 'import swiftqk' 2>/dev/null; }
pybuild=
if [ "$phase" != sanitize ] && [ "$phase" != sweep ] && ! has_ext; then  # built while the C++ tests run
  ( cmake -S . -B build-py -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DSWIFTQK_BUILD_TESTS=OFF \
      -DSWIFTQK_BUILD_BENCHMARKS=OFF -DSWIFTQK_BUILD_PYTHON=ON \
      -DPython_EXECUTABLE="$(command -v python3)" && cmake --build build-py ) \
    >"$OUT/build_py.log" 2>&1 &
  pybuild=$!
fi
wait_ext() {
  if [ -n "$pybuild" ]; then
    wait "$pybuild" || tail -20 "$OUT/build_py.log"
    pybuild=
  fi
  has_ext
}

run_pytest() {  # the CPU-only cases ran in CI already; here what needs the GPU
  if ! wait_ext; then
    note "python extension did not build: see build_py.log"
    return
  fi
  local n=$(( $(nproc) / 2 )); [ "$n" -gt 8 ] && n=8
  timeout "${1:-400}" python3 -m pytest -q -n "$n" -k "not on_cpu" tests/python \
    >"$OUT/pytest.log" 2>&1
  note "pytest: $(tail -1 "$OUT/pytest.log")"
  if grep -q "crashed while running" "$OUT/pytest.log"; then  # a native backtrace of the crash
    local t
    t=$(grep -o "crashed while running '[^']*'" "$OUT/pytest.log" | head -1 | cut -d"'" -f2)
    timeout 120 cuda-gdb -batch -ex run -ex bt --args python3 -m pytest -p no:xdist -q "$t" \
      >"$OUT/crash_bt.log" 2>&1
  fi
}

verifying=0
case "$phase" in all | verify) verifying=1 ;; esac
if [ "$verifying" = 1 ]; then
  timeout 420 build/tests/swiftqk_gpu_tests --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
  note "gpu gtests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/gpu_tests.log" | tr '\n' ' ')"
fi
if [ "$verifying" = 1 ] || [ "$phase" = sweep ]; then
  [ -z "$tps" ] && note "sweep: one GPU here, nothing to run one process per GPU"
  for tp in $tps; do
    timeout 400 build/bench/swiftqk_bench --procs "$tp" --iters 60 --commit "$commit" \
      --methods swiftqk,minimax_fused,all_gather,comm_overlap,minimax_eager \
      --json "$OUT/bench_procs_tp$tp.json" >"$OUT/bench_procs_tp$tp.log" 2>&1
    note "bench procs $tp: $(tail -1 "$OUT/bench_procs_tp$tp.log")"
    python3 bench/ratio_table.py "$OUT/bench_procs_tp$tp.json" \
      --target all_gather=0.85,minimax_fused=0.30 >"$OUT/ratios_procs_tp$tp.md" 2>&1
    note "$(tail -3 "$OUT/ratios_procs_tp$tp.md")"
    # The precision study across GPUs: bf16 comes with the sweep above; fp8-e4m3 inputs here.
    timeout 120 build/bench/swiftqk_bench --procs "$tp" --dtype fp8 --tokens 64,4096 --iters 20 \
      --methods swiftqk,minimax_fused,all_gather,minimax_eager --commit "$commit" \
      --json "$OUT/bench_procs_fp8_tp$tp.json" >"$OUT/bench_procs_fp8_tp$tp.log" 2>&1
    python3 bench/precision_table.py "$OUT/bench_procs_tp$tp.json" \
      "$OUT/bench_procs_fp8_tp$tp.json" >"$OUT/precision_procs_tp$tp.md" 2>&1
    note "precision tp $tp: $(tail -1 "$OUT/precision_procs_tp$tp.md")"
  done
fi
[ "$verifying" = 1 ] && run_pytest

# The TP decode run, one process per GPU, with and without the fused epilogue, then transformers'
# own TP plan against apply_swiftqk_tp at the models' real dimensions (random weights).
if [ "$phase" = verify ] || [ "$phase" = decode ] || [ "$phase" = all ]; then
  if [ -n "$tps" ] && wait_ext; then
    for tp in $tps; do
      for model in ${E2E_MODELS:-olmo2-13b olmo3-32b olmoe}; do
        timeout 300 python3 -m torch.distributed.run --nproc-per-node "$tp" bench/e2e_decode.py \
          --model "$model" --layers 8 --batch 1,32,256 --context 512,4096 --iters 30 \
          --methods swiftqk,minimax_fused,all_gather,minimax_eager \
          --json "$OUT/e2e_tp${tp}_$model.json" >"$OUT/e2e_tp${tp}_$model.log" 2>&1
        note "e2e tp $tp $model: $(tail -1 "$OUT/e2e_tp${tp}_$model.log")"
        # The fused epilogue (rows swiftqk_epilogue) against the swiftqk rows above.
        timeout 200 python3 -m torch.distributed.run --nproc-per-node "$tp" bench/e2e_decode.py \
          --model "$model" --layers 8 --batch 1,32,256 --context 512,4096 --iters 30 \
          --methods swiftqk --fused-epilogue --json "$OUT/e2e_epilogue_tp${tp}_$model.json" \
          >"$OUT/e2e_epilogue_tp${tp}_$model.log" 2>&1
        note "e2e epilogue tp $tp $model: $(tail -1 "$OUT/e2e_epilogue_tp${tp}_$model.log")"
        timeout 400 python3 -m torch.distributed.run --nproc-per-node "$tp" \
          bench/transformers_tp.py --model "$model" --layers 4 --batch 1,8,64 \
          --workdir "$OUT/ckpt" --json "$OUT/hf_tp${tp}_$model.json" \
          >"$OUT/hf_tp${tp}_$model.log" 2>&1
        rc=$?
        note "transformers tp $tp $model: exit $rc, $(grep -c DISAGREES "$OUT/hf_tp${tp}_$model.log") disagreements"
      done
    done
    rm -rf "$OUT/ckpt"
  fi
fi

if [ "$phase" = measure ] || [ "$phase" = all ]; then
  timeout 220 build/bench/swiftqk_bench --methods swiftqk,minimax_fused --tokens 1,64,4096,16384 \
    --tp 1,2,4,8 --iters 40 --commit "$commit" --json "$OUT/bench_methods.json" \
    >"$OUT/bench_methods.log" 2>&1
  note "bench methods: $(tail -1 "$OUT/bench_methods.log")"
  python3 bench/ratio_table.py "$OUT/bench_methods.json" --against minimax_fused \
    --target minimax_fused=0.0 >"$OUT/ratios_virtual.md" 2>&1
  note "$(tail -1 "$OUT/ratios_virtual.md")"
  timeout 90 build/bench/swiftqk_bench --dtype bf16,fp8 --methods swiftqk,minimax_fused,all_gather \
    --tp 1 --tokens 4096 --iters 20 --commit "$commit" --json "$OUT/bench_precision.json" \
    >"$OUT/bench_precision.log" 2>&1
  note "bench precision: $(tail -1 "$OUT/bench_precision.log")"
  # The independent paths (PyTorch's rms_norm, the HF classes) on the gathered tensors, beside.
  timeout 120 python3 bench/precision_study.py --json "$OUT/precision_study.json" \
    >"$OUT/precision_study.log" 2>&1
  note "precision study: $(head -1 "$OUT/precision_study.log")"
  study=(); [ -s "$OUT/precision_study.json" ] && study=("$OUT/precision_study.json")
  python3 bench/precision_table.py "$OUT/bench_precision.json" ${study[@]+"${study[@]}"} \
    >"$OUT/precision.md" 2>&1
  note "precision: $(tail -1 "$OUT/precision.md")"
  timeout 90 python3 bench/torch_rms_norm.py --iters 100 --json "$OUT/torch.json" \
    --swiftqk-json "$OUT/bench_methods.json" >"$OUT/torch.log" 2>&1
  note "torch: $(tail -1 "$OUT/torch.log")"
  timeout 120 build/bench/swiftqk_bench --soak 1000000 --models olmo2-13b --tokens 1,7,64,513 \
    --tp 4 --commit "$commit" --json "$OUT/soak.json" >"$OUT/soak.log" 2>&1
  note "soak: $(head -1 "$OUT/soak.log"); $(tail -1 "$OUT/soak.log")"
  [ "$phase" = measure ] && run_pytest 170
  if has_ext; then
    for model in ${E2E_MODELS:-olmo2-13b olmo3-32b olmoe}; do
      timeout 80 python3 bench/e2e_decode.py --model "$model" --layers 8 --batch 1,32,256 \
        --context 512,4096 --iters 20 --methods swiftqk,plain --json "$OUT/e2e_tp1_$model.json" \
        >"$OUT/e2e_tp1_$model.log" 2>&1
      note "e2e tp 1 $model: $(tail -1 "$OUT/e2e_tp1_$model.log")"
    done
  fi
fi

if [ "$phase" = measure ] || [ "$phase" = sanitize ] || [ "$phase" = all ]; then
  # compute-sanitizer on a subset that covers every kernel (the full suite is too slow there).
  # API errors are not reported: every CUDA call of ours is checked and would throw, and NCCL
  # probes kernels for other architectures at init (cudaErrorNoKernelImageForDevice, handled).
  # Under racecheck the kernels run tens of times slower: the tests' peer waits are scaled so
  # that TP-2 blocks waiting on each other are not cut off by a bound sized for the bare GPU.
  # FewBlocks: a grid of one or two SMs, so each block runs dozens of iterations (deferred
  # schedule, stage ring wrap, parity buffers) at TP 1, 2 and 4 in a few seconds of the tool.
  # racecheck leaves out the graph-replay test: under racecheck its 2000 replays outlast the
  # step's time limit, and replays run the same kernel code as the other tests.
  filter='Design/ModelShapes.*tp2_t333_q5120_k1024*:FewBlocks/ModelShapes.*'
  filter+=':Faults.MissingPeerTimesOutNamingIt:NcclGroupOfOne.FromNcclRunsEveryMethod'
  filter+=':SlotScrub.*'  # the scrub calls' bank-wide stores (TP 2, 4 and 8)
  default_tools=memcheck; [ "$phase" = sanitize ] && default_tools="memcheck racecheck synccheck"
  for tool in ${SANITIZERS:-$default_tools}; do
    f=$filter; [ "$tool" != racecheck ] && f+=':GraphReplay.Tp2Llama'
    start=$SECONDS
    SWIFTQK_TEST_WAIT_SCALE=${SWIFTQK_TEST_WAIT_SCALE:-30} timeout "${SANITIZER_TIMEOUT_S:-150}" \
      compute-sanitizer --tool "$tool" --error-exitcode 9 --report-api-errors no \
      build/tests/swiftqk_gpu_tests --gtest_brief=1 --gtest_filter="$f" \
      >"$OUT/sanitizer_$tool.log" 2>&1
    rc=$?; [ $rc = 124 ] && rc="124 (time limit)"
    note "compute-sanitizer $tool: exit $rc in $((SECONDS - start)) s ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/sanitizer_$tool.log" | tr '\n' ' '))"
  done
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"

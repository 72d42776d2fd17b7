#!/usr/bin/env bash
# Hardware counters of the TP-1 SwiftQK kernel and of the copy kernel moving the same bytes
# (bench/swiftqk_bench's eager mode), for the models and token count given:
#   bash scripts/ncu_profile.sh [models=olmoe,olmo2-13b] [tokens=4096]
# Clocks are left alone (--clock-control none). Reports go to $OUT/ncu_{swiftqk,copy}_<model>.txt
# (default ./results, which git ignores).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats"
sections+=" --section Occupancy --section LaunchStats --section SchedulerStats"
IFS=, read -ra models <<<"${1:-olmoe,olmo2-13b}"
tokens=${2:-4096}
run() {  # kernel regex, launches of it to skip, report
  timeout 120 ncu --clock-control none -k "regex:$1" --launch-skip "$2" --launch-count 1 \
    $sections build/bench/swiftqk_bench --mode eager --models "$m" --tokens "$tokens" --tp 1 \
    --methods swiftqk --iters 5 >"$3" 2>&1
  echo "ncu $1 $m: exit $? ($(grep -c 'GPU Speed Of Light' "$3") kernel(s) profiled)"
}
for m in "${models[@]}"; do
  # Eager mode: one checked call, 10 warm-up and 5 timed calls; the copy kernel runs 30 times
  # for the 1 GiB bandwidth, then 15 times for the same bytes as the TP-1 call.
  run swiftqk_fused 5 "$OUT/ncu_swiftqk_$m.txt"
  run copy_kernel 35 "$OUT/ncu_copy_$m.txt"
done

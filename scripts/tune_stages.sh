#!/usr/bin/env bash
# Times SwiftQK at several launch shapes side by side in one run: stage depths (--stages, rows
# each token group stages through shared memory), deferral depths with peers (--defer), block
# sizes (--block-threads) and vectors per thread (--vpt), the benchmark's launch-tuning flags,
# optionally against other builds of the benchmark (run at their defaults, each named by its
# folder), and prints one table: median us per (model, tp, tokens) and run. Every timed
# configuration is verified against float64 by the benchmark first; wrong results are counted
# per run in the table's heading.
#   bash scripts/tune_stages.sh [tokens] [tp] [shapes] [other_bench,...]
# A shape is DEPTH[+DEFER][/THREADS][xVPT]: DEPTH the stages ("d" the library's default), DEFER
# the deferral depth with peers, THREADS the block size, VPT the vectors per thread of staged
# rows (a row then takes the fewest lanes, down to 8). The first shape runs
# first and again last, the difference being the noise.
# A shape may be listed more than once; its later runs are numbered (s3_d2, s3_d2_2, ...).
#   e.g. bash scripts/tune_stages.sh 4096 1,2,4,8 d,2,3,d/128,d/512 /path/to/old/swiftqk_bench
#        bash scripts/tune_stages.sh 4096 2,4,8 d,3+1,4+2,5+3,3+2,dx8,3+2x8
# TUNE_ARGS adds benchmark flags to every run (the benchmark's defaults otherwise), e.g.
#        TUNE_ARGS="--dtype fp8 --models olmoe,minimax-m2" bash scripts/tune_stages.sh 4096 1 d,3,dx8
# JSON per run and the table go to $OUT (default ./results, which git ignores).
set -uo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-4096}
tps=${2:-1,2,4,8}
depths=${3:-d,2,3,4,5}
other=${4:-}
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
bench=build/bench/swiftqk_bench
common=(--methods swiftqk --tokens "$tokens" --tp "$tps" --iters "${ITERS:-30}")
read -ra extra <<<"${TUNE_ARGS:-}"
common+=(${extra[@]+"${extra[@]}"})
runs=()
# The table of the runs finished so far, rewritten after every run: a sweep stopped part-way
# still leaves the table of what finished.
table() {
  python3 - "$OUT" "${runs[@]}" >"$OUT/tune_table.txt" <<'EOF'
import json, os, sys
out, names = sys.argv[1], sys.argv[2:]
rows, wrong = {}, {}
for n in names:
    path = os.path.join(out, f"tune_{n}.json")
    if not os.path.exists(path):
        continue
    for r in json.load(open(path)):
        key = (r["model"], r["tp"], r["tokens"])
        rows.setdefault(key, {})[n] = r["median_us"]
        wrong[n] = wrong.get(n, 0) + r["wrong"]
print("median us (graph replays); wrong results per run: " +
      ", ".join(f"{n}={wrong.get(n, 'missing')}" for n in names))
print("| model | tp | tokens | " + " | ".join(names) + " | best |")
print("|---|---|---|" + "---|" * (len(names) + 1))
for key in sorted(rows):
    v = rows[key]
    best = min(v, key=v.get)
    cells = [f"{v[n]:.2f}" if n in v else "-" for n in names]
    print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {best} |")
EOF
}
run() {  # name, then the command
  # A name already taken (a shape listed twice to see the noise, or two builds in folders of
  # the same name) is numbered, so no run overwrites another's results.
  local base=$1 name=$1 k=2 r; shift
  for r in "${runs[@]}"; do [ "$r" = "$name" ] && name="${base}_$k" && k=$((k + 1)); done
  "$@" "${common[@]}" --json "$OUT/tune_$name.json" >"$OUT/tune_$name.log" 2>&1 \
    || echo "run $name failed: $(tail -2 "$OUT/tune_$name.log")"
  runs+=("$name")
  table
}
shape_run() {  # shape, run name suffix
  local shape=${1%%x*} vpt= depth threads= defer= name
  [ "$1" != "$shape" ] && vpt=${1#*x}
  depth=${shape%%/*}
  [ "$shape" != "$depth" ] && threads=${shape#*/}
  case $depth in *+*) defer=${depth#*+}; depth=${depth%%+*} ;; esac
  name="s$depth${defer:+_d$defer}${threads:+_b$threads}${vpt:+_v$vpt}$2"
  local flags=()
  [ "$depth" = d ] || flags+=(--stages "$depth")
  [ -z "$defer" ] || flags+=(--defer "$defer")
  [ -z "$threads" ] || flags+=(--block-threads "$threads")
  [ -z "$vpt" ] || flags+=(--vpt "$vpt")
  run "$name" "$bench" ${flags[@]+"${flags[@]}"}
}
IFS=, read -ra ds <<<"$depths"
shape_run "${ds[0]}" _first
IFS=, read -ra others <<<"$other"
# Another build is named by its folder: build/old/swiftqk_bench and build/old/bench/swiftqk_bench
# are both "old" (the folder "bench" alone would name every build the same and each run would
# overwrite the last one's results); run numbers a name already taken.
for b in "${others[@]}"; do
  d=$(dirname "$b")
  [ "$(basename "$d")" = bench ] && d=$(dirname "$d")
  run "$(basename "$d")" "$b"
done
for d in "${ds[@]:1}"; do shape_run "$d" ""; done
shape_run "${ds[0]}" _again
cat "$OUT/tune_table.txt"

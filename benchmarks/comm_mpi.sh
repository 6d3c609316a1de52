#!/usr/bin/env bash
# Allreduce busbw of trainscope's comm benchmark against a plain MPI_Allreduce loop, per size.
# Benchmark (not a test): trainscope's communication benchmark (dist::CommBenchmark, MPI backend,
# allreduce) and the reference, launched alternately by this one script, and the busbw ratio
# trainscope / MPI per size (target: within 5%, ratio >= 0.95).
#   scripts/bench comm_mpi [--np 2] [--min-bytes 8] [--max-bytes 67108864] [--warmup 5]
#                          [--iters 20] [--small-iters 2000] [--small-max 65536] [--repeats 5]
# Both sides: float32 sum in place, warm-up, barrier, timed loop, each rank's mean time per
# operation averaged over ranks, busbw = bytes / time x 2(n-1)/n (nccl-tests). Sizes up to
# --small-max bytes run --small-iters timed operations (a 8 B allreduce takes ~0.2 us: 20 of them
# would time the clock, not MPI), larger ones --iters. Each side runs --repeats times, interleaved
# and alternating which side goes first; per size the best (highest) busbw of each side is
# compared, which discounts interference from other processes on the cores. Needs the programs
# comm_bench_driver and mpi_allreduce_ref from $BUILD_DIR/tests (default build/):
#   ninja comm_bench_driver mpi_allreduce_ref
# Both run at MPI_THREAD_SINGLE: trainscope's comm workload asks for it (training asks for
# MPI_THREAD_SERIALIZED, for its progress thread), the reference uses plain MPI_Init. (With
# TS_REF_THREAD_MULTIPLE=1 the reference runs at MPI_THREAD_MULTIPLE instead, to show what a
# threaded level costs Open MPI per call.) Launched through scripts/mpirun.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$here/build}
np=2 min=8 max=67108864 warmup=5 iters=20 small_iters=2000 small_max=65536 repeats=5
while [ $# -gt 0 ]; do
    case $1 in
    --np) np=$2; shift 2 ;;
    --min-bytes) min=$2; shift 2 ;;
    --max-bytes) max=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --small-iters) small_iters=$2; shift 2 ;;
    --small-max) small_max=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/bench comm_mpi: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
driver=$build/tests/comm_bench_driver
ref=$build/tests/mpi_allreduce_ref
for exe in "$driver" "$ref"; do
    [ -x "$exe" ] || { echo "scripts/bench comm_mpi: $exe not built (ninja -C $build comm_bench_driver mpi_allreduce_ref)" >&2; exit 2; }
done
export OMP_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# One side over [lo, hi] with `it` timed operations per size, appended to $out/<side>.<k>.
run_side() { # side k lo hi it
    local side=$1 k=$2 lo=$3 hi=$4 it=$5
    [ "$lo" -le "$hi" ] || return 0
    if [ "$side" = ts ]; then
        "$here/scripts/mpirun" -np "$np" "$driver" comm.ops=allreduce comm.min_bytes="$lo" \
            comm.max_bytes="$hi" comm.warmup="$warmup" comm.iters="$it" >>"$out/ts.$k"
    else
        "$here/scripts/mpirun" -np "$np" "$ref" "$lo" "$hi" "$warmup" "$it" >>"$out/ref.$k"
    fi
}
# The sizes of the sweep (min, 2 min, 4 min, ...) split at --small-max.
small_hi=$min
while [ $((small_hi * 2)) -le "$small_max" ] && [ $((small_hi * 2)) -le "$max" ]; do
    small_hi=$((small_hi * 2))
done
[ "$small_hi" -le "$small_max" ] || small_hi=0
for ((k = 0; k < repeats; ++k)); do
    if ((k % 2 == 0)); then order="ts ref"; else order="ref ts"; fi
    for side in $order; do
        if [ "$small_hi" -ge "$min" ]; then
            run_side "$side" "$k" "$min" "$small_hi" "$small_iters"
            run_side "$side" "$k" $((small_hi * 2)) "$max" "$iters"
        else
            run_side "$side" "$k" "$min" "$max" "$iters"
        fi
    done
done
python3 - "$out" "$repeats" "$np" <<'PY'
import sys, glob
out, repeats, np = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def best(pattern, bytes_col, busbw_col):
    table = {}
    for path in glob.glob(f"{out}/{pattern}.*"):
        for line in open(path):
            if line.startswith("#") or not line.strip():
                continue
            f = line.split()
            b, bw = int(f[bytes_col]), float(f[busbw_col])
            table[b] = max(table.get(b, 0.0), bw)
    return table
ts = best("ts", 1, 6)    # op bytes count time_s time_max_s algbw busbw
ref = best("ref", 0, 2)  # bytes time_s busbw
print(f"allreduce busbw, float32, {np} ranks, best of {repeats} runs per side (GB/s)")
print(f"{'bytes':>12} {'trainscope':>12} {'MPI_Allreduce':>14} {'ratio':>7}")
worst = None
for b in sorted(set(ts) & set(ref)):
    ratio = ts[b] / ref[b] if ref[b] > 0 else float("nan")
    worst = ratio if worst is None else min(worst, ratio)
    flag = "" if ratio >= 0.95 else "  < 0.95"
    print(f"{b:>12} {ts[b]:>12.4f} {ref[b]:>14.4f} {ratio:>7.3f}{flag}")
if worst is not None:
    print(f"lowest ratio {worst:.3f} (target >= 0.95)")
PY

#!/usr/bin/env bash
# Gradient compression measured on two emulated nodes (issue 40, point 4): for each link rate and
# each dist.compress setting, 2 + 2 ranks of the CV quick start and of the tiny LLM full
# fine-tuning, one run file each; tests/multinode/compression_table.py turns them into tables.
#   tests/multinode/compression_study.sh OUTDIR            # as root, from the repository root
# Files: OUTDIR/<rate>/<workload>_<compress>_rep<k>.h5, and OUTDIR/runs.tsv (one line per run:
# rate, workload, compress, repeat, exit code, wall seconds; exit 3 = the setting was refused).
# Idempotent: a run whose file says status "completed" is skipped (FORCE=1 redoes it). The link is
# taken down at exit, also on failure or Ctrl-C.
# Environment: TRAINSCOPE (binary; default build/app/trainscope), RATES (default
# "100mbit 1gbit unlimited"; unlimited = the veth without a limit), COMPRESS, WORKLOADS,
# REPEATS (1; raising it later runs only the new repeats),
# CV_ITERS (40), LLM_ITERS (48; 4 iterations per epoch of the 64 instruct samples at 2 + 2 ranks),
# AUTOGROUP_NICE (e.g. -10: the nice value of this session's scheduler autogroup; with
# kernel.sched_autogroup_enabled=1 a process's nice counts only inside its session's group, so other
# sessions' nice-19 builds otherwise get as much CPU as these ranks).
# OUTDIR/cpustat.log samples /proc/stat every 2 s (compression_table.py reports from it the share of
# the cores niced processes took during each run).
set -euo pipefail
out=${1:?usage: $0 OUTDIR}
bin=${TRAINSCOPE:-build/app/trainscope}
rates=${RATES:-100mbit 1gbit unlimited}
compress_settings=${COMPRESS:-none fp16 bf16 powersgd}
workloads=${WORKLOADS:-cv llm}
repeats=${REPEATS:-1}
cv_iters=${CV_ITERS:-40}
llm_iters=${LLM_ITERS:-48}
here=$(dirname "$0")

[ -x "$bin" ] || { echo "no binary at $bin (set TRAINSCOPE)" >&2; exit 2; }
mkdir -p "$out"
touch "$out/runs.tsv"
if [ -n "${AUTOGROUP_NICE:-}" ]; then echo "$AUTOGROUP_NICE" >/proc/self/autogroup; fi
cat /proc/self/autogroup
while true; do echo "$(date +%s) $(head -1 /proc/stat)"; sleep 2; done >>"$out/cpustat.log" &
sampler=$!
trap 'kill $sampler; "$here"/netns_nodes.sh down' EXIT

completed() { [ -f "$1" ] && h5dump -a /status "$1" 2>/dev/null | grep -q '"completed"'; }

workload_options() {
    case "$1" in
    cv) echo "--config inputs/quickstart.ini --train.max_iters=$cv_iters" ;;
    # 12 epochs of 4 iterations: a loss curve of 48 points; the shipped config stops at 2 epochs.
    llm) echo "--config inputs/llm/full-tiny.ini --train.epochs=$(((llm_iters + 3) / 4))
               --train.max_iters=$llm_iters" ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
    esac
}

for rep in $(seq 1 "$repeats"); do
    for rate in $rates; do
        limit=$rate
        [ "$rate" = unlimited ] && limit=
        # shellcheck disable=SC2086  # no rate argument for the unlimited link
        "$here"/netns_nodes.sh up $limit
        mkdir -p "$out/$rate"
        for wl in $workloads; do
            for c in $compress_settings; do
                file=$out/$rate/${wl}_${c}_rep${rep}.h5
                if [ "${FORCE:-0}" != 1 ] && completed "$file"; then
                    echo "skip $file (completed)"
                    continue
                fi
                echo "run  $file"
                t0=$(date +%s.%N)
                rc=0
                # shellcheck disable=SC2046  # workload_options is a list of words
                OMP_NUM_THREADS=1 timeout 600 mpirun --allow-run-as-root \
                    --host 10.77.0.1:2,10.77.0.2:2 --mca plm_rsh_agent "$here"/ns_agent \
                    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
                    --mca oob_tcp_if_include 10.77.0.0/24 --bind-to none \
                    --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS -np 4 \
                    "$bin" $(workload_options "$wl") --dist.compress="$c" \
                    --telemetry.enabled=false --log.every=0 --output.overwrite=true \
                    --output.file="$file" >"${file%.h5}.log" 2>&1 || rc=$?
                t1=$(date +%s.%N)
                printf '%s\t%s\t%s\t%s\t%s\t%.1f\n' "$rate" "$wl" "$c" "$rep" "$rc" \
                    "$(echo "$t1 - $t0" | bc)" | tee -a "$out/runs.tsv"
            done
        done
    done
done

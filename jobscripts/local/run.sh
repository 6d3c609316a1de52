#!/usr/bin/env bash
# One study point without a scheduler: plain mpirun on this host (or on the hosts of
# TRAINSCOPE_HOSTS, "h1:4,h2:4"). Rendered by jobscripts/sweep like the batch templates.
set -euo pipefail

run_dir=@@RUN_DIR@@
binary=@@BINARY@@
site_env=@@SITE_ENV@@
ranks=@@RANKS@@
ranks_per_node=@@RANKS_PER_NODE@@
cpus_per_task=@@CPUS_PER_TASK@@
trainscope_args=(@@TRAINSCOPE_ARGS@@)

# Binding defaults; the site file may change them.
bind_to=core
mpirun_extra=()
# shellcheck source=/dev/null
source "$site_env"

mkdir -p "$run_dir"
[ "$0" -ef "$run_dir/job.sh" ] || cp "$0" "$run_dir/job.sh"
export OMP_NUM_THREADS=$cpus_per_task
env | grep -E '^(NCCL_|OMPI_|PMIX_|UCX_|OMP_|CUDA_)' | sort > "$run_dir/environment.txt" || true
hosts=()
[ -n "${TRAINSCOPE_HOSTS:-}" ] && hosts=(--host "$TRAINSCOPE_HOSTS")
mpirun -np "$ranks" ${hosts[@]+"${hosts[@]}"} --map-by "ppr:${ranks_per_node}:node:PE=${cpus_per_task}" \
    --bind-to "$bind_to" --report-bindings ${mpirun_extra[@]+"${mpirun_extra[@]}"} \
    "$binary" "${trainscope_args[@]}" 2> >(tee "$run_dir/binding.txt" >&2) > "$run_dir/stdout.txt"

#!/usr/bin/env bash
# One study point without a scheduler: plain mpirun on this host (or on the hosts of
# TRAINSCOPE_HOSTS, "h1:4,h2:4"). Rendered by jobscripts/sweep like the batch templates.
set -euo pipefail

run_dir=/work/main/studies/cv-strategies-cpu/ddp_fp32/strong/n01/rep0
binary=/work/main/build/app/trainscope
site_env=/work/main/jobscripts/site/default.env
ranks=1
ranks_per_node=1
cpus_per_task=1
trainscope_args=(--config /work/main/inputs/cv/base.ini --config /work/main/inputs/cv/strategy-ddp.ini --run.scaling=strong --run.global_batch=32 --output.file=/work/main/studies/cv-strategies-cpu/ddp_fp32/strong/n01/rep0/run.h5 --output.overwrite=true --train.max_iters=12 --profile.warmup_iters=2 --log.every=0 --train.eval=false --run.precision=fp32)

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

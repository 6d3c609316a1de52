# shellcheck shell=bash
# Sourced by the wrappers in bin/: sets root (this clone) and python (the project's venv made by
# scripts/setup: $TRAINSCOPE_VENV, else ${TRAINSCOPE_CACHE:-~/.cache/trainscope}/venv-torch<the
# version scripts/setup pins>), and exports TRAINSCOPE_ROOT (trainscope_jobs.paths: the tree whose
# job-script templates, inputs and build the job commands use) unless the caller named one.
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
export TRAINSCOPE_ROOT=${TRAINSCOPE_ROOT:-$root}
venv=${TRAINSCOPE_VENV:-}
if [ -z "$venv" ]; then
    torch=$(sed -n 's/^TORCH_VERSION=\([^ ]*\).*/\1/p' "$root/scripts/setup")
    venv=${TRAINSCOPE_CACHE:-$HOME/.cache/trainscope}/venv-torch$torch
fi
python=$venv/bin/python
if [ ! -x "$python" ]; then
    echo "$(basename "$0"): no Python environment at $venv: run $root/scripts/setup first" \
         "(or set TRAINSCOPE_VENV)" >&2
    exit 2
fi

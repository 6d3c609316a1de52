#!/usr/bin/env bash
# NF4 dequantisation: bytes and time per dequantised weight, now against the former path.
# Builds and runs the program nf4_dequant_bench ($BUILD_DIR/tests, default build/; not built by
# default): the Llama-3-8B projection shapes in bf16 and fp32, the host tensor counter's peak per
# weight during one call and the median time per weight (see tests/bench/nf4_dequant_bench.cpp).
#   scripts/bench nf4 [--reps 9]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$here/build}
ninja -C "$build" nf4_dequant_bench >&2
exec "$build/tests/nf4_dequant_bench" "$@"

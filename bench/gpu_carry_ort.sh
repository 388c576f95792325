#!/usr/bin/env bash
# Builds DIR (default .gpu-ort/ in the repository root): PyPI's onnxruntime-gpu wheel (~256 MB)
# in 60 MiB pieces for a GPU machine that cannot reach PyPI (bench/gpu_carry_wheel.sh says how
# the pieces travel and are joined; bench/README.md, "GPU").
#
# Usage: bench/gpu_carry_ort.sh [DIR]    ORT_VERSION=1.31.1 PYVER=3.12 PIECE_MIB=60
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
exec "$ROOT/bench/gpu_carry_wheel.sh" "onnxruntime-gpu==${ORT_VERSION:-1.31.1}" "${1:-$ROOT/.gpu-ort}"

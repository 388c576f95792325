"""The chosen Triton qa cases, in one place: which file and case, the repository its test.sh
builds (a recipe), the environment it sets and the server flags it starts with.

A group is one server: its cases run one after another against one ``conch serve`` on one
repository, as the test.sh runs them against one ``tritonserver``. Where a test.sh restarts
the server with another config for each case (L0_model_queue, L0_model_config), each case is
a group of its own. Flags that change only the server's logging are left out, unless a
case reads the server's log.

Each recipe repeats its test.sh's shell in Python, step for step (``repository.py``); the
models the test.sh takes from ``/data/inferenceserver`` come from Triton's generators.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tools.triton_qa.repository import (
    Build,
    append,
    copy,
    copy_all,
    nop_version_dirs,
    sed,
    sed_first,
)

Recipe = Callable[[Build, Path], None]  # builds a group's repository into the given folder


@dataclass(frozen=True)
class Case:
    """One run of a qa file: ``python <file> <argv...>`` in the file's folder."""

    file: str  # under qa/
    case: str  # as the table shows it
    argv: tuple[str, ...]  # {repository} stands for the group's repository

    @property
    def label(self) -> str:
        return f"{self.file} :: {self.case}"

    @property
    def folder(self) -> str:
        """The file's folder under qa/, where it runs."""
        return str(PurePosixPath(self.file).parent)


def unit(file: str, cls: str, *tests: str) -> tuple[Case, ...]:
    """Cases of a unittest file, each run alone (``python file.py Class.test``)."""
    return tuple(Case(file, test, (f"{cls}.{test}",)) for test in tests)


@dataclass(frozen=True)
class Group:
    name: str
    build: Recipe
    cases: tuple[Case, ...]
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # Paths of Triton's repository the recipe reads, beside qa/common and the cases' folders.
    reads: tuple[str, ...] = ()
    # Where the test.sh writes the server's log, for the cases that read it (relative to the
    # cases' folder): the runner links conch serve's log there.
    server_log: str | None = None

    @property
    def needs(self) -> set[str]:
        folders = {f"qa/{c.folder}" for c in self.cases}
        return {"qa/common", *folders, *self.reads}


# -- L0_infer_zero: tensors with a 0 in their shape, through every backend and ensemble ----


def infer_zero_models(b: Build, repo: Path) -> None:
    copy_all(b.data("qa_identity_model_repository"), repo)
    copy_all(b.data("qa_ensemble_model_repository/qa_identity_model_repository"), repo)
    nop_version_dirs(repo)


INFER_ZERO = Group(
    "infer_zero",
    infer_zero_models,
    unit(
        "L0_infer_zero/infer_zero_test.py",
        "InferZeroTest",
        *("test_ff1_sanity", "test_ff1", "test_ff3_sanity"),
        *(f"test_ff3_{i}" for i in range(5)),
        *("test_hh1_sanity", "test_hh1_0", "test_hh1_1", "test_hh1_2", "test_hh3_sanity"),
        *(f"test_hh3_{i}" for i in range(5)),
        *("test_oo1_sanity", "test_oo1", "test_oo3_sanity"),
        *(f"test_oo3_{i}" for i in range(5)),
        *("test_bb1_sanity", "test_bb1_0"),
    ),
)

# -- L0_model_queue: one server per case, each with its own queue policy -------------------

QUEUE_TEST = "L0_model_queue/model_queue_test.py"
QUEUE_POLICIES = {
    "test_max_queue_size": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ]"
        " default_queue_policy { max_queue_size: 8 } }\n"
        'parameters [ { key: "execute_delay_ms" value: { string_value: "5000" } } ]'
    ),
    "test_policy_delay": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000"
        " default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 } }"
    ),
    "test_policy_reject": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000"
        " default_queue_policy { default_timeout_microseconds: 100000 } }"
    ),
    "test_timeout_override": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000"
        " default_queue_policy { allow_timeout_override: true"
        " default_timeout_microseconds: 1000000 } }"
    ),
    "test_priority_levels": (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000"
        " priority_levels: 2 default_priority_level: 2 }"
    ),
    "test_max_priority_levels": (  # the largest uint64 levels, a default past uint32
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000"
        f" priority_levels: {2**64 - 1} default_priority_level: {2**32} }}"
    ),
    "test_priority_with_policy": (
        "dynamic_batching { preferred_batch_size: [ 4, 8, 32 ]"
        " max_queue_delay_microseconds: 10000000 priority_levels: 2 default_priority_level: 2"
        " default_queue_policy { timeout_action: DELAY allow_timeout_override: true"
        " default_timeout_microseconds: 11000000 }"
        " priority_queue_policy { key: 2 value: { timeout_action: REJECT"
        " allow_timeout_override: true default_timeout_microseconds: 11000000 } } }"
    ),
}


def queue_models(policy: str) -> Recipe:
    def build(b: Build, repo: Path) -> None:
        custom = copy(b.qa("custom_models/custom_zero_1_float32"), repo / "custom_zero_1_float32")
        (custom / "1").mkdir(exist_ok=True)
        config = custom / "config.pbtxt"
        sed(config, r"dims:.*\[.*\]", "dims: [ -1 ]", every=True)
        sed(config, r"max_batch_size:.*", "max_batch_size: 32")
        append(config, "instance_group [ { kind: KIND_CPU count: 1 }]")
        ensemble = copy(
            b.qa("L0_model_queue/ensemble_zero_1_float32"), repo / "ensemble_zero_1_float32"
        )
        (ensemble / "1").mkdir(exist_ok=True)
        append(config, policy)

    return build


MODEL_QUEUE = tuple(
    Group(
        f"model_queue.{test}",
        queue_models(policy),
        unit(QUEUE_TEST, "ModelQueueTest", test),
        reads=("qa/custom_models/custom_zero_1_float32",),
    )
    for test, policy in QUEUE_POLICIES.items()
)

# -- L0_infer_reshape: models and ensembles whose tensors take a config's reshape ----------

RESHAPE_CUSTOM = (  # the ONNX reshape models the test.sh copies onto the identity backend
    *("nobatch_zero_3_float32", "nobatch_zero_4_float32"),
    *(f"zero_{i}_float32" for i in range(1, 5)),
    *(f"nobatch_zero_{i}_int32" for i in range(1, 4)),
    *(f"zero_{i}_int32" for i in range(1, 4)),
)


def reshape_models(b: Build, repo: Path) -> None:
    copy_all(b.data("qa_reshape_model_repository"), repo)
    copy_all(b.data("qa_ensemble_model_repository/qa_reshape_model_repository"), repo)
    for suffix in RESHAPE_CUSTOM:
        model = copy(repo / f"onnx_{suffix}", repo / f"custom_{suffix}")
        shutil.rmtree(model / "1")
        (model / "1").mkdir()
        config = model / "config.pbtxt"
        sed(config, r"^platform:.*", 'backend: "identity"')
        sed(config, r"^name:.*", f'name: "custom_{suffix}"')
        append(config, "instance_group [ { kind: KIND_CPU }]")
    nop_version_dirs(repo)


INFER_RESHAPE = Group(
    "infer_reshape",
    reshape_models,
    unit(
        "L0_infer_reshape/infer_reshape_test.py",
        "InferReshapeTest",
        *(f"test_ff{i}" for i in range(1, 5)),
        *(f"test_ii{i}" for i in range(1, 4)),
        "test_oo1",
    ),
)

# -- L0_http: the HTTP frontend's own unit tests, and its input size limits ----------------


def http_models(b: Build, repo: Path) -> None:
    identity = b.data("qa_identity_model_repository")
    for name in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16"):
        copy(identity / name, repo / name)
    copy(identity / "onnx_zero_3_float32", repo / "onnx_zero_3_float32")
    one = copy(repo / "onnx_zero_1_object", repo / "onnx_zero_1_object_1_element")
    sed(one / "config.pbtxt", "onnx_zero_1_object", "onnx_zero_1_object_1_element")
    sed_first(one / "config.pbtxt", "-1", "1")
    queue = copy(repo / "onnx_zero_1_float32", repo / "onnx_zero_1_float32_queue")
    sed(queue / "config.pbtxt", "onnx_zero_1_float32", "onnx_zero_1_float32_queue")
    append(
        queue / "config.pbtxt",
        "dynamic_batching { max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ]"
        " default_queue_policy { max_queue_size: 1 } }",
    )
    copy(b.example("simple_identity"), repo / "simple_identity")
    int64 = copy(b.example("simple_identity"), repo / "simple_identity_int64")
    sed(int64 / "config.pbtxt", "TYPE_STRING", "TYPE_INT64")
    sed(int64 / "config.pbtxt", "simple_identity", "simple_identity_int64")


EXAMPLES = "docs/examples/model_repository"
# test_loading_large_invalid_model is left out: its client builds a 2 GiB model file and
# its base64 in memory (over 10 GB of the client's own), more than a developer's machine
# has to spare beside the server.

HTTP = Group(
    "http",
    http_models,
    unit(
        "L0_http/http_test.py",
        "HttpTest",
        *("test_raw_binary", "test_raw_binary_longer", "test_byte", "test_byte_too_many_elements"),
        *("test_multi_variable_dimensions", "test_multi_inputs"),
        *("test_content_encoding_chunked_manually", "test_content_encoding_unsupported_client"),
        *("test_descriptive_status_code", "test_buffer_size_overflow", "test_negative_dimensions"),
        "test_load_oversized_file_parameter",
        *("test_json_recursion_depth_limit", "test_duplicate_output_names"),
        "test_repository_index_deeply_nested_json",
        "test_inference_header_content_length_out_of_range",
    ),
    flags=("--model-control-mode=explicit", "--load-model=*"),
    reads=(EXAMPLES,),
)


def input_size_models(b: Build, repo: Path) -> None:
    identity = b.data("qa_identity_model_repository")
    copy(identity / "onnx_zero_1_float32", repo / "onnx_zero_1_float32")
    copy(b.example("simple_identity"), repo / "simple_identity")


SIZE_TEST = "L0_http/http_input_size_limit_test.py"
# test_no_leak_on_invalid_inference_header_length is left out: it reads the memory of the
# one server process (SERVER_PID), and conch serve is a family of processes.
INPUT_SIZE_DEFAULT = Group(
    "http_input_size.default",
    input_size_models,
    unit(
        SIZE_TEST,
        "InferSizeLimitTest",
        *("test_default_limit_raw_binary", "test_default_limit_json", "test_large_string_in_json"),
        *("test_default_limit_compressed", "test_json_dtype_size_expansion_exceeds_limit_error"),
    ),
    reads=(EXAMPLES,),
)
INPUT_SIZE_INCREASED = Group(
    "http_input_size.increased",
    input_size_models,
    unit(
        SIZE_TEST,
        "InferSizeLimitTest",
        *("test_large_input_raw_binary", "test_large_input_json", "test_large_input_compressed"),
    ),
    flags=(f"--http-max-input-size={2**27}",),
    reads=(EXAMPLES,),
)

# -- L0_metrics: the pending request count while each kind of scheduler holds requests -----

QUEUE_DELAY_US = 100_000
BATCH = 4


def queue_size_models(b: Build, repo: Path) -> None:
    default = copy(b.qa("L0_metrics/identity_delay"), repo / "default")
    (default / "1").mkdir(exist_ok=True)
    sed(default / "config.pbtxt", r"^max_batch_size.*", f"max_batch_size: {BATCH}")
    later = {
        "dynamic": f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}",
        "max_queue_size": (
            f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US}"
            " default_queue_policy { max_queue_size: 4 } }"
        ),
        "sequence_direct": (
            f"sequence_batching {{ direct {{ max_queue_delay_microseconds: {QUEUE_DELAY_US},"
            " minimum_slot_utilization: 1.0 } }"
        ),
        "sequence_oldest": (
            f"sequence_batching {{ oldest {{ max_queue_delay_microseconds: {QUEUE_DELAY_US},"
            f" max_candidate_sequences: {BATCH} }} }}"
        ),
    }
    for name, scheduler in later.items():
        append(copy(default, repo / name) / "config.pbtxt", scheduler)
    ensemble = copy(b.qa("L0_metrics/ensemble_delay"), repo / "ensemble")
    (ensemble / "1").mkdir(exist_ok=True)
    copy(default, repo / "default_composing")
    copy(repo / "dynamic", repo / "dynamic_composing")


QUEUE_SIZE = Group(
    "metrics_queue_size",
    queue_size_models,
    unit(
        "L0_metrics/metrics_queue_size_test.py",
        "MetricsPendingRequestCountTest",
        *("test_default_scheduler", "test_dynamic_batch_scheduler", "test_fail_max_queue_size"),
        *("test_sequence_batch_scheduler_direct", "test_sequence_batch_scheduler_oldest"),
        "test_ensemble_scheduler",
    ),
    env={"MAX_BATCH_SIZE": str(BATCH), "MAX_QUEUE_DELAY_US": str(QUEUE_DELAY_US)},
)

# -- L0_backend_python/lifecycle: Python models' errors, cancellations and metrics ----------


def lifecycle_models(b: Build, repo: Path) -> None:
    def take(name: str) -> Path:
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(b.qa(f"python_models/{name}/model.py"), repo / name / "1" / "model.py")
        config = repo / name / "config.pbtxt"
        shutil.copyfile(b.qa(f"python_models/{name}/config.pbtxt"), config)
        return config

    take("error_code")
    take("execute_cancel")
    for name, delay_us in (("execute_error", 12_000_000), ("execute_grpc_error", 1_200_000)):
        config = take(name)
        sed(config, r"^name:.*", f'name: "{name}"')
        sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
        append(
            config,
            f"dynamic_batching {{ preferred_batch_size: [8], max_queue_delay_microseconds: {delay_us} }}",
        )
    take("decoupled_grpc_error")
    take("execute_return_error")
    config = take("wrong_model")
    sed(config, r"^name:.*", 'name: "wrong_model"')
    sed(config, "TYPE_FP32", "TYPE_UINT32", every=True)


LIFECYCLE = Group(
    "python_lifecycle",
    lifecycle_models,
    unit(
        "L0_backend_python/lifecycle/lifecycle_test.py",
        "LifecycleTest",
        *("test_error_code", "test_execute_cancel", "test_batch_error", "test_infer_pymodel_error"),
        *("test_triton_grpc_error_error_on", "test_triton_grpc_error_multithreaded"),
        *("test_triton_grpc_error_cancel", "test_triton_grpc_error_decoupled_delayed_final"),
        "test_triton_grpc_error_error_off",
    ),
    flags=("--log-verbose=1",),
    reads=("qa/python_models",),
    server_log="lifecycle_server.log",
)

# -- L0_model_config: the config Triton completes for a model without a full one -----------

AUTOFILL = "L0_model_config/autofill_noplatform_success"


def autofill_model(backend: str, target: str) -> Recipe:
    def build(b: Build, repo: Path) -> None:
        model = copy(b.qa(f"{AUTOFILL}/{backend}/{target}"), repo / target)
        if (backend, target) == ("onnx", "cpu_instance"):
            (model / "1").mkdir(exist_ok=True)
            identity = b.data("qa_identity_model_repository")
            shutil.copyfile(identity / "onnx_zero_1_float16/1/model.onnx", model / "1/model.onnx")

    return build


MODEL_CONFIG = tuple(
    Group(
        f"autofill.{backend}.{target}",
        autofill_model(backend, target),
        (
            Case(
                "L0_model_config/compare_status.py",
                f"{backend}/{target}",
                ("--expected_dir", f"{{repository}}/{target}", "--model", target),
            ),
        ),
        flags=("--strict-model-config=false",),
    )
    for backend, target in (
        ("onnx", "cpu_instance"),
        ("onnx", "empty_config"),
        ("onnx", "no_config"),
        ("onnx", "no_config_no_batch"),
    )
)

GROUPS: tuple[Group, ...] = (
    INFER_ZERO,
    *MODEL_QUEUE,
    INFER_RESHAPE,
    HTTP,
    INPUT_SIZE_DEFAULT,
    INPUT_SIZE_INCREASED,
    QUEUE_SIZE,
    LIFECYCLE,
    *MODEL_CONFIG,
)

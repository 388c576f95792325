"""The python backend through the real path: Triton-style model.py files served by a real
worker and gateway, driven with stock tritonclient.http.

The repository is built here in a tmp folder: functions/add_sub and functions/text_sentiment
copied as shipped (written for Triton, not for conch), plus small probe models.
"""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conch.backends import BackendRequest, backend_class
from conch.backends.completion import complete
from conch.core.repository import ModelRepository

from harness import ROOT, start_gateway, start_worker, wait_model_ready, wait_until

SHARED_MODELS = (
    "add_sub",
    "text_sentiment",
    "probe",
    "probe_single",
    "async_model",
    "init_args",
    "autocomplete",
    "decoupled",
    "bad_init",
)
READY_MODELS = SHARED_MODELS[:-1]

# -- the test models ----------------------------------------------------------------------

PROBE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }}
]
dynamic_batching {{ {batching} }}
"""

# X's first value picks what the probe does with that request.
PROBE_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

ERRORS = {
    -1: pb_utils.TritonError.INVALID_ARG,
    -2: pb_utils.TritonError.UNAVAILABLE,
    -4: pb_utils.TritonError.NOT_FOUND,
    -5: pb_utils.TritonError.UNSUPPORTED,
    -6: pb_utils.TritonError.CANCELLED,
    -10: pb_utils.TritonError.UNKNOWN,
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            what = int(x.flat[0])
            if what in ERRORS:
                error = pb_utils.TritonError("probe error %d" % what, ERRORS[what])
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if what == -3:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("probe error -3"))
                )
                continue
            if what == -7:
                raise RuntimeError("the probe was asked to raise")
            if what == -9:
                bls = pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=[]
                )
                raise pb_utils.TritonModelException(bls.exec().error().message())
            if what == -11:
                return responses
            rows = x.shape[0]
            outputs = [pb_utils.Tensor("OUT", x.copy())]
            if what != -8:
                outputs.append(
                    pb_utils.Tensor("COUNT", np.full((rows, 1), len(requests), np.int32))
                )
            outputs.append(
                pb_utils.Tensor(
                    "PARAMS",
                    np.array(
                        [[json.dumps({"parameters": json.loads(request.parameters()),
                                      "id": request.request_id(),
                                      "timeout": request.timeout()}).encode()]] * rows,
                        dtype=object,
                    )
                )
            )
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

ASYNC_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def initialize(self, args):
        await asyncio.sleep(0)
        self.factor = 2.0

    async def execute(self, requests):
        await asyncio.sleep(0.001)
        loop = id(asyncio.get_running_loop())
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", x * self.factor),
                        pb_utils.Tensor("LOOP", np.full((x.shape[0], 1), loop, np.int64)),
                    ]
                )
            )
        return responses
"""

ASYNC_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "LOOP" data_type: TYPE_INT64 dims: [ 1 ] }
]
"""

# Two versions; each imports the helper.py beside it, which must not clash.
INIT_ARGS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

import helper


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        args = json.dumps(self.args).encode()
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("ARGS", np.array([args], dtype=object)),
                    pb_utils.Tensor("HELPER", np.array([helper.VALUE.encode()], dtype=object)),
                ]
            )
            for _ in requests
        ]
"""

INIT_ARGS_CONFIG = """
backend: "python"
version_policy { all {} }
input [ { name: "DUMMY" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "HELPER" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

AUTOCOMPLETE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output(
            {"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}
        )
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 3)]))
        return responses
"""

SIMPLE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

BAD_INIT_MODEL = IDENTITY_MODEL.replace(
    "    def execute",
    "    def initialize(self, args):\n"
    "        raise pb_utils.TritonModelException('no weights in this folder')\n\n"
    "    def execute",
)

FINALIZE_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"]

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write("finalized")
"""


def _model(root: Path, name: str, config: str | None, model: str, version: int = 1) -> Path:
    path = root / name
    (path / str(version)).mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.pbtxt").write_text(textwrap.dedent(config))
    (path / str(version) / "model.py").write_text(textwrap.dedent(model))
    return path


def build_repository(root: Path, marker: Path) -> Path:
    root.mkdir(parents=True)
    for name in ("add_sub", "text_sentiment"):  # verbatim, as shipped
        shutil.copytree(ROOT / "functions" / name, root / name)
    _model(
        root,
        "probe",
        PROBE_CONFIG.format(batching="max_queue_delay_microseconds: 500000"),
        PROBE_MODEL,
    )
    _model(root, "probe_single", PROBE_CONFIG.format(batching=""), PROBE_MODEL)
    _model(root, "async_model", ASYNC_CONFIG, ASYNC_MODEL)
    for version, value in ((1, "one"), (2, "two")):
        _model(root, "init_args", INIT_ARGS_CONFIG, INIT_ARGS_MODEL, version)
        (root / "init_args" / str(version) / "helper.py").write_text(f"VALUE = {value!r}\n")
    _model(root, "autocomplete", None, AUTOCOMPLETE_MODEL)  # no config.pbtxt at all
    _model(
        root,
        "decoupled",
        SIMPLE_CONFIG + "model_transaction_policy { decoupled: true }\n",
        IDENTITY_MODEL,
    )
    _model(root, "bad_init", SIMPLE_CONFIG, BAD_INIT_MODEL)
    _model(
        root,
        "finalizer",
        SIMPLE_CONFIG + f'parameters {{ key: "marker" value {{ string_value: "{marker}" }} }}\n',
        FINALIZE_MODEL,
    )
    return root


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("python_backend")
    return build_repository(tmp / "models", tmp / "finalized.txt")


@pytest.fixture(scope="module")
def db(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def stack(repo: Path, db: str, log_dir: Path) -> Iterator[tuple[str, object]]:
    worker = start_worker(repo, db, log_dir, "--models", ",".join(SHARED_MODELS))
    gateway, url = start_gateway(repo, db, log_dir, threads=32)
    try:
        for m in READY_MODELS:
            wait_model_ready(url, m, 60, worker, gateway)
        yield url, worker
    finally:
        gateway.stop()
        worker.stop()


@pytest.fixture(scope="module")
def url(stack: tuple[str, object]) -> str:
    return stack[0]


def client(url: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url, network_timeout=60)


def fp32_input(name: str, array: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(array.shape), "FP32")
    i.set_data_from_numpy(array, binary_data=binary)
    return i


def probe(url: str, value: float, model: str = "probe", **kw) -> httpclient.InferResult:
    x = np.array([[value]], dtype=np.float32)
    return client(url).infer(model, [fp32_input("X", x)], **kw)


def probe_outcome(url: str, value: float, model: str = "probe") -> object:
    try:
        return probe(url, value, model)
    except InferenceServerException as exc:
        return exc


def concurrently(n: int, fn) -> list[object]:
    barrier = threading.Barrier(n)

    def one(i: int) -> object:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


# -- add_sub, as written for Triton -------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_adds_and_subtracts(url: str, binary: bool) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
    ]
    result = client(url).infer(
        "add_sub",
        [fp32_input("INPUT0", a, binary), fp32_input("INPUT1", b, binary)],
        outputs=outputs,
    )
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_add_sub_answers_only_the_requested_output(url: str) -> None:
    a = np.ones((1, 4), np.float32)
    result = client(url).infer(
        "add_sub",
        [fp32_input("INPUT0", a), fp32_input("INPUT1", a * 5)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a * 5)
    assert result.as_numpy("OUTPUT0") is None


def test_add_sub_metadata_and_config(url: str) -> None:
    meta = client(url).get_model_metadata("add_sub")
    assert meta["platform"] == "python"
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("INPUT0", "FP32", [-1, 4]),
        ("INPUT1", "FP32", [-1, 4]),
    ]
    config = client(url).get_model_config("add_sub")
    assert config["backend"] == "python" and config["max_batch_size"] == 8


def test_model_logger_writes_to_the_worker_log(stack: tuple[str, object]) -> None:
    worker = stack[1]
    assert "add_sub instance add_sub_0_0 ready (kind CPU)" in worker.log()


def test_a_burst_of_add_sub_requests_is_answered_each_with_its_own_result(url: str) -> None:
    arrays = [np.full((1, 4), float(i), np.float32) for i in range(16)]

    def one(i: int) -> np.ndarray:
        return (
            client(url)
            .infer("add_sub", [fp32_input("INPUT0", arrays[i]), fp32_input("INPUT1", arrays[i])])
            .as_numpy("OUTPUT0")
        )

    for i, got in enumerate(concurrently(16, one)):
        np.testing.assert_array_equal(got, arrays[i] * 2)


# -- BYTES --------------------------------------------------------------------------------


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_text_sentiment_tokenizes_and_labels(url: str, binary: bool) -> None:
    texts = np.array(
        [
            [b"I really love this, it's not bad at all"],
            [b"The app is slow and broken"],
            ["Bonjour à tous".encode()],
        ],
        dtype=object,
    )
    inp = httpclient.InferInput("TEXT", list(texts.shape), "BYTES")
    inp.set_data_from_numpy(texts, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary)
        for n in ("TOKENS", "LENGTH", "LABEL", "SCORE")
    ]
    result = client(url).infer("text_sentiment", [inp], outputs=outputs)
    lengths = result.as_numpy("LENGTH")
    assert lengths.tolist() == [[9], [6], [3]]
    # tritonclient gives BYTES as bytes from binary outputs and as str from JSON ones.
    tokens = np.vectorize(_text, otypes=[object])(result.as_numpy("TOKENS"))
    assert tokens.shape == (3, 9)
    assert [t for t in tokens[2] if t] == ["bonjour", "à", "tous"]
    assert list(tokens[1]) == ["the", "app", "is", "slow", "and", "broken", "", "", ""]
    labels = [_text(x) for x in result.as_numpy("LABEL").ravel()]
    assert labels == ["positive", "negative", "neutral"]
    assert result.as_numpy("SCORE").ravel().tolist() == [5.0, -3.0, 0.0]


def test_text_sentiment_rejects_invalid_utf8_for_that_request_only(url: str) -> None:
    bad = np.array([[b"\xff\xfe not text"]], dtype=object)
    inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(bad)
    with pytest.raises(InferenceServerException) as info:
        client(url).infer("text_sentiment", [inp])
    assert info.value.status() == "400"
    assert "UTF-8" in info.value.message()


# -- batching: a list of requests ---------------------------------------------------------


def test_a_dynamic_batch_reaches_execute_as_a_list_of_requests(url: str) -> None:
    results = concurrently(8, lambda i: probe(url, float(i + 1)))
    counts = []
    for i, result in enumerate(results):
        # Each request has its own outputs, not a slice of a stacked tensor.
        np.testing.assert_array_equal(result.as_numpy("OUT"), [[float(i + 1)]])
        counts.append(int(result.as_numpy("COUNT")[0, 0]))
    assert max(counts) > 1, f"every request ran alone: {counts}"
    assert max(counts) <= 8


def test_request_parameters_reach_the_model_as_json(url: str) -> None:
    result = probe(
        url,
        1.0,
        "probe_single",
        parameters={"temperature": "high", "top_k": 3},
        request_id="client-7",
        timeout=30_000_000,
    )
    seen = json.loads(result.as_numpy("PARAMS")[0, 0])
    assert seen["parameters"] == {"temperature": "high", "top_k": 3}
    assert seen["id"] == "client-7"  # the client's id, as Triton hands it to the model
    assert seen["timeout"] == 30_000_000


# -- errors -------------------------------------------------------------------------------


def test_error_responses_fail_only_their_own_request_in_a_batch(url: str) -> None:
    values = [-1.0, -2.0, -3.0, 1.0, 2.0, -4.0, -5.0, 3.0]
    outcomes = concurrently(8, lambda i: probe_outcome(url, values[i]))
    expected = {-1.0: "400", -2.0: "503", -3.0: "500", -4.0: "404", -5.0: "501"}
    counts = []
    for value, outcome in zip(values, outcomes, strict=True):
        if value in expected:
            assert isinstance(outcome, InferenceServerException), value
            assert outcome.status() == expected[value], (value, outcome)
            assert f"probe error {int(value)}" in outcome.message()
        else:
            assert not isinstance(outcome, Exception), (value, outcome)
            np.testing.assert_array_equal(outcome.as_numpy("OUT"), [[value]])
            counts.append(int(outcome.as_numpy("COUNT")[0, 0]))
    # The successes shared their execute() with failing requests.
    assert max(counts) > 1, counts


@pytest.mark.parametrize(("value", "status"), [(-6.0, "400"), (-10.0, "400")])
def test_cancelled_and_unknown_codes_are_400(url: str, value: float, status: str) -> None:
    outcome = probe_outcome(url, value, "probe_single")
    assert isinstance(outcome, InferenceServerException)
    assert outcome.status() == status


def test_execute_raising_fails_the_batch_with_500_and_the_worker_keeps_serving(
    stack: tuple[str, object],
) -> None:
    url, worker = stack
    outcome = probe_outcome(url, -7.0, "probe_single")
    assert isinstance(outcome, InferenceServerException)
    assert outcome.status() == "500"
    assert "the probe was asked to raise" in outcome.message()
    assert "RuntimeError" in outcome.message()
    assert worker.alive()
    np.testing.assert_array_equal(probe(url, 4.0, "probe_single").as_numpy("OUT"), [[4.0]])


def test_a_missing_requested_output_is_a_500_naming_it(url: str) -> None:
    outcome = probe_outcome(url, -8.0, "probe_single")
    assert isinstance(outcome, InferenceServerException)
    assert outcome.status() == "500"
    assert "COUNT" in outcome.message()
    # Not asking for it is fine.
    result = probe(url, -8.0, "probe_single", outputs=[httpclient.InferRequestedOutput("OUT")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[-8.0]])


def test_too_few_responses_fail_the_batch(url: str) -> None:
    outcome = probe_outcome(url, -11.0, "probe_single")
    assert isinstance(outcome, InferenceServerException)
    assert outcome.status() == "500"
    assert "0 response(s) for 1 request(s)" in outcome.message()


def test_a_bls_error_can_fail_the_model(url: str) -> None:
    # The BLS call's own error (add_sub needs inputs) comes back from exec(), not raised;
    # the probe raises it. tests/integration/serving/test_bls.py covers BLS itself.
    outcome = probe_outcome(url, -9.0, "probe_single")
    assert isinstance(outcome, InferenceServerException)
    assert outcome.status() == "500"
    assert outcome.message().startswith(
        "Failed to process the request(s) for model instance 'probe_single_"
    )
    assert "missing required input(s) ['INPUT0', 'INPUT1']" in outcome.message()
    assert "model 'add_sub'" in outcome.message()


# -- async, initialize args, versions, auto-complete --------------------------------------


def test_async_execute_runs_on_one_event_loop_per_instance(url: str) -> None:
    loops = set()
    for value in (1.5, 2.5, 3.5):
        result = client(url).infer(
            "async_model", [fp32_input("X", np.array([[value]], np.float32))]
        )
        np.testing.assert_array_equal(result.as_numpy("OUT"), [[value * 2]])
        loops.add(int(result.as_numpy("LOOP")[0, 0]))
    assert len(loops) == 1


@pytest.mark.parametrize(("version", "helper"), [("1", b"one"), ("2", b"two")])
def test_initialize_gets_tritons_args_all_strings(
    url: str, repo: Path, version: str, helper: bytes
) -> None:
    inp = httpclient.InferInput("DUMMY", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], np.int32))
    result = client(url).infer("init_args", [inp], model_version=version)
    args = json.loads(result.as_numpy("ARGS")[0])
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_name"] == "init_args"
    assert args["model_version"] == version
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "init_args_0"
    assert args["model_instance_device_id"] == "0"
    assert Path(args["model_repository"]) == repo / "init_args"
    config = json.loads(args["model_config"])
    assert config["name"] == "init_args"
    assert config["input"][0]["dims"] == [1]  # int64 dims as JSON numbers
    assert config["backend"] == "python"
    # Each version imported its own model.py and its own sibling helper.py.
    assert result.as_numpy("HELPER")[0] == helper


def test_auto_complete_config_fills_inputs_outputs_and_batching(url: str) -> None:
    meta = client(url).get_model_metadata("autocomplete")
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("IN", "FP32", [-1, 2])
    ]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("OUT", "FP32", [-1, 2])
    ]
    config = client(url).get_model_config("autocomplete")
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert config["backend"] == "python"
    x = np.array([[1.0, 2.0]], np.float32)
    result = client(url).infer("autocomplete", [fp32_input("IN", x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 3)


def _index_row(url: str, model: str) -> dict:
    rows = [r for r in client(url).get_model_repository_index() if r["name"] == model]
    assert rows, model
    return rows[0]


def test_decoupled_models_load(url: str) -> None:
    # Their responses, from the worker's side: tests/integration/backends/test_python_decoupled.py
    row = _index_row(url, "decoupled")
    assert row["state"] == "READY"
    assert client(url).is_model_ready("decoupled")


def test_initialize_raising_makes_the_model_unavailable_with_its_message(url: str) -> None:
    wait_until(
        lambda: "no weights in this folder" in _index_row(url, "bad_init").get("reason", ""),
        10,
        "bad_init's reason",
    )
    assert _index_row(url, "bad_init")["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException) as info:
        client(url).infer("bad_init", [fp32_input("X", np.array([1.0], np.float32))])
    assert "no weights in this folder" in info.value.message()


# -- finalize on warm shutdown ------------------------------------------------------------


def test_finalize_runs_on_warm_shutdown(
    stack: tuple[str, object], repo: Path, db: str, log_dir: Path
) -> None:
    url = stack[0]
    marker = repo.parent / "finalized.txt"
    worker = start_worker(repo, db, log_dir, "--models", "finalizer")
    try:
        wait_model_ready(url, "finalizer", 60, worker)
        x = np.array([7.0], np.float32)
        result = client(url).infer("finalizer", [fp32_input("X", x)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), x)
        assert not marker.exists()
    finally:
        code = worker.stop(signal.SIGTERM)
    assert marker.read_text() == "finalized", f"worker exited {code}:\n{worker.log()[-3000:]}"


# -- the backend on its own: load errors name the model -----------------------------------


def _read(tmp_path: Path, name: str, config: str | None, model: str):
    _model(tmp_path, name, config, model)
    return ModelRepository(tmp_path, complete=complete).read_model(name)


def test_model_py_without_the_class_is_a_load_error(tmp_path: Path) -> None:
    entry = _read(tmp_path, "nocls", SIMPLE_CONFIG, "class Model:\n    pass\n")
    assert entry.error is not None
    assert "nocls" in entry.error and "TritonPythonModel" in entry.error


def test_model_py_that_fails_to_import_is_a_load_error(tmp_path: Path) -> None:
    entry = _read(tmp_path, "broken_py", SIMPLE_CONFIG, "import not_a_module_anywhere_xyz\n")
    assert entry.error is not None
    assert "broken_py" in entry.error and "not_a_module_anywhere_xyz" in entry.error


def test_completing_a_config_runs_no_model_code_without_auto_complete_config(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "imported.txt"
    side_effect = f"open({str(marker)!r}, 'w').close()\n"
    entry = _read(tmp_path, "quiet", SIMPLE_CONFIG, side_effect + IDENTITY_MODEL)
    assert entry.error is None, entry.error
    assert not marker.exists()  # the gateway's scan did not import it
    _model(tmp_path, "loud", None, side_effect + AUTOCOMPLETE_MODEL)
    assert ModelRepository(tmp_path, complete=complete).read_model("loud").error is None
    assert marker.exists()  # auto_complete_config has to be imported to be called


def test_a_syntax_error_is_reported_when_the_repository_is_read(tmp_path: Path) -> None:
    entry = _read(tmp_path, "typo", SIMPLE_CONFIG, IDENTITY_MODEL + "\ndef oops(:\n")
    assert entry.error is not None
    assert "typo" in entry.error and "syntax error" in entry.error


def test_auto_complete_conflicting_with_the_config_is_a_load_error(tmp_path: Path) -> None:
    config = SIMPLE_CONFIG.replace(
        'name: "X" data_type: TYPE_FP32 dims: [ 1 ]', 'name: "IN" data_type: TYPE_INT32 dims: [ 2 ]'
    )
    entry = _read(tmp_path, "conflict", config, AUTOCOMPLETE_MODEL)
    assert entry.error is not None
    assert "conflict" in entry.error and "IN" in entry.error and "data_type" in entry.error


def test_auto_complete_must_return_the_model_config(tmp_path: Path) -> None:
    model = AUTOCOMPLETE_MODEL.replace(
        "        return auto_complete_model_config\n", "        return None\n"
    )
    entry = _read(tmp_path, "noreturn", None, model)
    assert entry.error is not None
    assert "noreturn" in entry.error and "must return" in entry.error


def test_auto_complete_is_skipped_when_disabled(tmp_path: Path) -> None:
    _model(tmp_path, "autocomplete", None, AUTOCOMPLETE_MODEL)
    entry = ModelRepository(tmp_path, complete=complete, auto_complete=False).read_model(
        "autocomplete"
    )
    assert not entry.config.input and not entry.config.output  # nothing filled them in


TWICE_CONFIG = SIMPLE_CONFIG + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"

TWICE_MODEL = IDENTITY_MODEL.replace(
    "class TritonPythonModel:",
    "STATE = []\n\n\n"
    "class TritonPythonModel:\n"
    "    def initialize(self, args):\n"
    "        STATE.append(args['model_instance_name'])\n"
    "        self.state = STATE\n",
)


def test_two_instances_load_separate_modules(tmp_path: Path) -> None:
    _model(tmp_path, "twice", TWICE_CONFIG, TWICE_MODEL)
    entry = ModelRepository(tmp_path, complete=complete).read_model("twice")
    assert entry.error is None, entry.error
    cls = backend_class(entry.backend)
    instances = [cls(entry.spec(1), spec) for spec in entry.instances()]
    for b in instances:
        b.load()
    try:
        # Module state is per instance, as under Triton's one stub process per instance.
        assert [b.model.state for b in instances] == [["twice_0_0"], ["twice_0_1"]]
        out = instances[1].execute([BackendRequest({"X": np.array([2.0], np.float32)}, ["OUT"])])
        np.testing.assert_array_equal(out[0]["OUT"], [2.0])
    finally:
        for b in instances:
            b.unload()

"""conch's triton_python_backend_utils (``pb_utils``), on its own."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import numpy as np
import pytest

from conch.backends.python import pb_utils as pb
from conch.backends.python.backend import UTILS_MODULE, error_from_triton, install_utils

# -- datatypes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "np_type"),
    [
        ("TYPE_BOOL", 1, np.bool_),
        ("TYPE_UINT8", 2, np.uint8),
        ("TYPE_UINT16", 3, np.uint16),
        ("TYPE_UINT32", 4, np.uint32),
        ("TYPE_UINT64", 5, np.uint64),
        ("TYPE_INT8", 6, np.int8),
        ("TYPE_INT16", 7, np.int16),
        ("TYPE_INT32", 8, np.int32),
        ("TYPE_INT64", 9, np.int64),
        ("TYPE_FP16", 10, np.float16),
        ("TYPE_FP32", 11, np.float32),
        ("TYPE_FP64", 12, np.float64),
        ("TYPE_STRING", 13, np.object_),
    ],
)
def test_type_tables_agree(name: str, value: int, np_type: type) -> None:
    assert pb.triton_string_to_numpy(name) is np_type
    assert pb.triton_to_numpy_type(value) is np_type
    assert pb.numpy_to_triton_type(np_type) == value
    assert pb.Tensor("t", np.zeros(2, dtype=np_type)).triton_dtype() == value


def test_type_names_without_prefix_and_bytes() -> None:
    assert pb.triton_string_to_numpy("FP32") is np.float32
    assert pb.triton_string_to_numpy("BYTES") is np.object_
    assert pb.triton_string_to_numpy("TYPE_BF16") is None
    assert pb.triton_to_numpy_type(14) is None
    assert pb.numpy_to_triton_type(np.bytes_) == 13
    assert pb.numpy_to_triton_type(np.dtype("U3")) == 13
    assert pb.numpy_to_triton_type(np.dtype(">f4")) == 11
    assert pb.numpy_to_triton_type(np.complex64) is None
    with pytest.raises(ValueError, match="unknown data type"):
        pb.triton_string_to_numpy("TYPE_FP128")


def test_serialize_and_deserialize_bytes() -> None:
    arr = np.array([[b"ab", b""], [b"\x00\xff", "é".encode()]], dtype=object)
    raw = pb.serialize_byte_tensor(arr)
    assert raw.dtype == np.object_ and raw.shape == ()
    assert (
        raw.item()
        == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\x00\xff\x02\x00\x00\x00\xc3\xa9"
    )
    back = pb.deserialize_bytes_tensor(raw.item())
    assert back.dtype == np.object_
    assert back.tolist() == [b"ab", b"", b"\x00\xff", "é".encode()]
    assert pb.deserialize_bytes_tensor(raw).tolist() == back.tolist()
    assert (
        pb.serialize_byte_tensor(np.array(["x", "yz"])).item()
        == b"\x01\x00\x00\x00x\x02\x00\x00\x00yz"
    )
    assert pb.serialize_byte_tensor(np.array([], dtype=object)).size == 0
    with pytest.raises(TypeError):
        pb.serialize_byte_tensor(np.array([1.0]))
    with pytest.raises(ValueError, match="truncated"):
        pb.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


# -- tensors ------------------------------------------------------------------------------


def test_tensor_basics() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb.Tensor("X", arr)
    assert t.name() == "X"
    assert t.shape() == [2, 3]
    assert t.triton_dtype() == 11
    assert t.is_cpu() is True
    assert t.as_numpy() is arr
    with pytest.raises(TypeError):
        pb.Tensor(3, arr)  # type: ignore[arg-type]


def test_read_only_input_becomes_writable_once() -> None:
    arr = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not arr.flags.writeable
    t = pb.Tensor("X", arr)
    got = t.as_numpy()
    got += 1  # a model may change its input in place, as under Triton
    assert t.as_numpy() is got
    np.testing.assert_array_equal(got, [1, 2, 3, 4])


def test_bytes_tensor_is_an_object_array_of_bytes() -> None:
    t = pb.Tensor("T", np.array([b"a", b"bc"], dtype=object))
    assert t.triton_dtype() == 13
    assert t.as_numpy().tolist() == [b"a", b"bc"]
    with pytest.raises(pb.TritonModelException, match="BYTES"):
        t.to_dlpack()


def test_dlpack_round_trip_shares_memory() -> None:
    arr = np.arange(8, dtype=np.int32).reshape(2, 4)
    capsule = pb.Tensor("X", arr).to_dlpack()
    back = pb.Tensor.from_dlpack("Y", capsule)
    assert back.name() == "Y"
    np.testing.assert_array_equal(back.as_numpy(), arr)
    assert back.triton_dtype() == 8


def test_dlpack_with_torch() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    from_obj = pb.Tensor.from_dlpack("A", t)
    np.testing.assert_array_equal(from_obj.as_numpy(), t.numpy())
    from_capsule = pb.Tensor.from_dlpack("B", torch.utils.dlpack.to_dlpack(t))
    np.testing.assert_array_equal(from_capsule.as_numpy(), t.numpy())
    to_torch = torch.utils.dlpack.from_dlpack(pb.Tensor("C", np.ones(3, np.float32)).to_dlpack())
    assert to_torch.tolist() == [1.0, 1.0, 1.0]


def test_a_read_only_input_exports_to_dlpack_and_shares_its_memory() -> None:
    # A request's inputs are read-only views of the message; numpy refuses to export
    # those, and Triton's to_dlpack works on them.
    torch = pytest.importorskip("torch")
    arr = np.arange(4, dtype=np.float32)
    arr.setflags(write=False)
    t = pb.Tensor("IN", arr)
    shared = torch.utils.dlpack.from_dlpack(t.to_dlpack())
    assert shared.tolist() == [0.0, 1.0, 2.0, 3.0]
    shared += 1  # the tensor and the torch view are one buffer, as under Triton
    np.testing.assert_array_equal(t.as_numpy(), [1, 2, 3, 4])
    assert not arr.flags.writeable and arr[0] == 0  # the message's bytes are untouched
    strided = pb.Tensor("S", np.arange(8, dtype=np.int64)[::2])  # not contiguous
    assert torch.utils.dlpack.from_dlpack(strided.to_dlpack()).tolist() == [0, 2, 4, 6]


def test_a_bf16_tensor_goes_through_dlpack_not_numpy() -> None:
    """Triton's bf16 example: as_numpy refuses with Triton's words; torch's bfloat16
    in and out through DLPack, sharing memory, as a raw capsule too."""
    import ml_dtypes
    import torch

    values = np.array([1.0, -2.5, 3.0e5], dtype=ml_dtypes.bfloat16)
    tensor = pb.Tensor._bfloat16("X", values.view(np.uint16))
    with pytest.raises(pb.TritonModelException) as err:
        tensor.as_numpy()
    assert "tensor dtype is bf16 and cannot be converted to numpy" in str(err.value).lower()
    assert tensor.triton_dtype() == 14 and tensor.shape() == [3]
    shared = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert shared.dtype == torch.bfloat16
    assert shared.float().tolist() == [1.0, -2.5, 299008.0]
    shared.mul_(2)  # the same memory
    assert tensor._array.view(ml_dtypes.bfloat16).astype(np.float32).tolist()[0] == 2.0
    for source in (shared, torch.utils.dlpack.to_dlpack(shared), values):
        back = pb.Tensor.from_dlpack("Y", source)
        assert back.triton_dtype() == 14
        with pytest.raises(pb.TritonModelException):
            back.as_numpy()
    assert pb.Tensor.from_dlpack("Y", shared)._array.tolist() == tensor._array.tolist()
    assert pb.Tensor.from_dlpack("F", torch.ones(2)).triton_dtype() == 11  # FP32 stays numpy


def test_from_dlpack_refuses_what_is_not_dlpack() -> None:
    with pytest.raises(pb.TritonModelException, match="DLPack"):
        pb.Tensor.from_dlpack("X", [1, 2, 3])


# -- requests and responses ---------------------------------------------------------------


def _request() -> pb.InferenceRequest:
    return pb.InferenceRequest(
        model_name="m",
        requested_output_names=["OUT"],
        inputs=[pb.Tensor("A", np.ones(2)), pb.Tensor("B", np.zeros(2))],
        request_id="r1",
        parameters={"k": "v", "n": 3},
    )


def test_request_accessors() -> None:
    req = _request()
    assert pb.get_input_tensor_by_name(req, "B").name() == "B"
    assert pb.get_input_tensor_by_name(req, "C") is None
    assert req.requested_output_names() == ["OUT"]
    assert req.request_id() == "r1"
    assert json.loads(req.parameters()) == {"k": "v", "n": 3}
    assert req.correlation_id() == 0
    assert req.flags() == 0
    assert req.timeout() == 0
    assert req.is_cancelled() is False
    assert pb.InferenceRequest().parameters() == "{}"


def test_strings_may_be_bytes_as_tritons_bindings_take_them() -> None:
    """Triton's bindings take ``bytes`` wherever they take a string: a BLS model names its
    target with an element of a TYPE_STRING input, which ``as_numpy()`` gives as bytes."""
    names = pb.Tensor("MODEL_NAME", np.array([b"add_sub"], dtype=np.object_))
    req = pb.InferenceRequest(
        model_name=names.as_numpy()[0],
        requested_output_names=(b"OUTPUT0", np.str_("OUTPUT1")),
        inputs=[pb.Tensor(b"INPUT0", np.ones(4, np.float32))],
        request_id=b"r1",
    )
    assert req.model_name() == "add_sub" and type(req.model_name()) is str
    assert req.requested_output_names() == ["OUTPUT0", "OUTPUT1"]
    assert req.inputs()[0].name() == "INPUT0"
    assert req.request_id() == "r1"
    # What the BLS port is handed is plain text, so the call reaches model 'add_sub'.
    sent = pb.bls_request(req)
    assert sent.model_name == "add_sub" and sent.requested_output_names == ["OUTPUT0", "OUTPUT1"]
    assert pb.TritonError(b"bad input").message() == "bad input"
    # Any iterable of names, a generator included (Triton: any list or tuple).
    gen = pb.InferenceRequest(model_name="m", requested_output_names=(n for n in ["A", "B"]))
    assert gen.requested_output_names() == ["A", "B"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_name": 7}, "model_name must be a string"),
        ({"model_name": b"\xff\xfe"}, "UTF-8"),
        ({"requested_output_names": "OUTPUT0"}, "not the single string"),
        ({"requested_output_names": 5}, "must be a list of strings"),
        ({"requested_output_names": ["A", None]}, "must be a string"),
        ({"request_id": 1}, "request_id must be a string"),
    ],
)
def test_request_refuses_what_is_not_text(kwargs: dict, match: str) -> None:
    args = {"model_name": "m", "requested_output_names": ["A"], **kwargs}
    with pytest.raises(TypeError, match=match):
        pb.InferenceRequest(**args)


def test_tensor_and_error_refuse_names_that_are_not_text() -> None:
    with pytest.raises(TypeError, match="tensor name"):
        pb.Tensor(3, np.ones(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TritonError message"):
        pb.TritonError(None)  # type: ignore[arg-type]


def test_bls_and_model_control_outside_a_worker_say_they_need_one() -> None:
    req = _request()
    for resp in (req.exec(), asyncio.run(req.async_exec())):
        assert resp.has_error()
        assert resp.error().code() == pb.TritonError.UNAVAILABLE
        assert "business logic scripting" in resp.error().message()
        assert "needs a conch worker" in resp.error().message()
    with pytest.raises(pb.TritonModelException, match="needs a conch worker"):
        pb.is_model_ready("other")
    with pytest.raises(pb.TritonModelException, match="response sender"):
        req.get_response_sender()  # a request a model builds has none
    with pytest.raises(pb.TritonModelException, match="needs a conch worker"):
        pb.load_model("other")
    with pytest.raises(pb.TritonModelException, match="needs a conch worker"):
        pb.unload_model("other")
    with pytest.raises(pb.TritonModelException, match="rescheduling"):
        req.set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def test_response_with_outputs_and_with_error() -> None:
    out = pb.Tensor("OUT", np.ones(2))
    ok = pb.InferenceResponse(output_tensors=[out])
    assert not ok.has_error() and ok.error() is None
    assert pb.get_output_tensor_by_name(ok, "OUT") is out
    assert pb.get_output_tensor_by_name(ok, "NOPE") is None
    assert ok.parameters() == "{}"
    bad = pb.InferenceResponse(error=pb.TritonError("nope", pb.TritonError.NOT_FOUND))
    assert bad.has_error() and bad.output_tensors() == []
    assert bad.error().message() == "nope" and bad.error().code() == pb.TritonError.NOT_FOUND
    positional = pb.InferenceResponse([out], None)
    assert positional.output_tensors() == [out]
    with pytest.raises(TypeError):
        pb.InferenceResponse(output_tensors=out)  # type: ignore[arg-type]


def test_triton_error_codes_and_statuses() -> None:
    e = pb.TritonError("boom")
    assert e.code() == pb.TritonError.INTERNAL and e.message() == "boom"
    expected = {
        pb.TritonError.UNKNOWN: 400,
        pb.TritonError.INTERNAL: 500,
        pb.TritonError.NOT_FOUND: 404,
        pb.TritonError.INVALID_ARG: 400,
        pb.TritonError.UNAVAILABLE: 503,
        pb.TritonError.UNSUPPORTED: 501,
        pb.TritonError.ALREADY_EXISTS: 400,
        pb.TritonError.CANCELLED: 400,
    }
    assert len({*expected}) == 8
    for code, status in expected.items():
        err = error_from_triton(pb.TritonError(f"m{code}", code))
        assert err.status == status and err.message == f"m{code}"
    with pytest.raises(ValueError):
        pb.TritonError("x", 42)


def test_one_code_table_both_ways() -> None:
    from conch.core.errors import TRITON_CODES, from_code, triton_code

    # Triton's numbering (TRITONSERVER_Error_Code), which Python models compare against.
    assert [pb.TritonError.UNKNOWN, pb.TritonError.CANCELLED] == [0, 7]
    assert list(TRITON_CODES.values()) == list(range(8))
    for name, number in TRITON_CODES.items():
        assert getattr(pb.TritonError, name) == number == triton_code(name)
        assert pb.TritonError("m", number).code_name() == name
        # conch error -> a BLS response's TritonError -> the conch error again
        error = from_code(name, "model 'x' said so")
        back = error_from_triton(pb.error_response(error, "x").error())
        assert (type(back), back.code, back.status) == (type(error), name, error.status)
    assert triton_code("NO_SUCH_CODE") == pb.TritonError.INTERNAL


def test_flags() -> None:
    assert pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1


# -- config helpers and ModelConfig -------------------------------------------------------

CONFIG = {
    "name": "m",
    "max_batch_size": 0,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [-1]}],
}


def _config() -> dict:
    return json.loads(json.dumps(CONFIG))


def test_config_lookups() -> None:
    cfg = _config()
    assert pb.get_input_config_by_name(cfg, "IN")["dims"] == [4]
    assert pb.get_output_config_by_name(cfg, "OUT")["data_type"] == "TYPE_STRING"
    assert pb.get_input_config_by_name(cfg, "OUT") is None
    assert pb.using_decoupled_model_transaction_policy(cfg) is False
    cfg["model_transaction_policy"] = {"decoupled": True}
    assert pb.using_decoupled_model_transaction_policy(cfg) is True


def test_model_config_adds_and_sets() -> None:
    mc = pb.ModelConfig(_config())
    mc.add_input({"name": "EXTRA", "data_type": "INT32", "dims": [2], "optional": True})
    mc.add_output({"name": "SCORE", "data_type": "TYPE_FP32", "dims": [1]})
    mc.set_max_batch_size(8)
    mc.set_dynamic_batching()
    mc.set_model_transaction_policy({"decoupled": False})
    cfg = mc.as_dict()
    assert cfg["input"][1] == {
        "name": "EXTRA",
        "data_type": "TYPE_INT32",
        "dims": [2],
        "optional": True,
    }
    assert cfg["output"][1]["name"] == "SCORE"
    assert cfg["max_batch_size"] == 8
    assert cfg["dynamic_batching"] == {}
    assert cfg["model_transaction_policy"] == {"decoupled": False}
    # The same value again is fine.
    mc.set_max_batch_size(8)


def test_model_config_accepts_an_entry_that_agrees_and_refuses_a_conflict() -> None:
    mc = pb.ModelConfig(_config())
    mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})  # agrees: no change
    assert len(mc.as_dict()["input"]) == 1
    with pytest.raises(ValueError, match=r"input 'IN' of model 'm' .* data_type TYPE_FP32"):
        mc.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match=r"output 'OUT' .* dims \[-1\]"):
        mc.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [3]})


def test_model_config_fills_an_entry_the_config_names_only() -> None:
    cfg = _config()
    cfg["input"].append({"name": "LATE", "data_type": "TYPE_INVALID", "dims": []})
    mc = pb.ModelConfig(cfg)
    mc.add_input({"name": "LATE", "data_type": "TYPE_INT64", "dims": [3]})
    assert mc.as_dict()["input"][1] == {"name": "LATE", "data_type": "TYPE_INT64", "dims": [3]}


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"data_type": "TYPE_FP32", "dims": [1]}, "no 'name'"),
        ({"name": "N", "dims": [1]}, "no 'data_type'"),
        ({"name": "N", "data_type": "TYPE_FP32"}, "no 'dims'"),
        ({"name": "N", "data_type": "TYPE_FP32", "dims": [1], "colour": 1}, "unknown field"),
        ({"name": "N", "data_type": "TYPE_FP32", "dims": "4"}, "list of integers"),
        ({"name": "N", "data_type": "TYPE_NOPE", "dims": [1]}, "unknown data type"),
    ],
)
def test_model_config_refuses_bad_entries(entry: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pb.ModelConfig(_config()).add_input(entry)


def test_model_config_refuses_conflicting_batch_size_and_schedulers() -> None:
    cfg = _config()
    cfg["max_batch_size"] = 4
    with pytest.raises(ValueError, match=r"max_batch_size 4, .* max_batch_size 8"):
        pb.ModelConfig(cfg).set_max_batch_size(8)
    with pytest.raises(TypeError):
        pb.ModelConfig(_config()).set_max_batch_size(True)
    seq = _config()
    seq["sequence_batching"] = {}
    with pytest.raises(ValueError, match="sequence_batching"):
        pb.ModelConfig(seq).set_dynamic_batching()
    with pytest.raises(ValueError, match="only 'decoupled'"):
        pb.ModelConfig(_config()).set_model_transaction_policy({"streaming": True})
    with pytest.raises(TypeError):
        pb.ModelConfig(_config()).set_model_transaction_policy({"decoupled": "yes"})


def test_model_config_from_json_text() -> None:
    assert pb.ModelConfig(json.dumps(CONFIG)).as_dict()["name"] == "m"


# -- logging and the module name ----------------------------------------------------------


def test_logger_writes_to_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="conch.python_model"):
        pb.Logger.log_info("info msg")
        pb.Logger.log_warn("warn msg")
        pb.Logger.log_error("error msg")
        pb.Logger.log_verbose("verbose msg")
        pb.Logger.log("explicit msg", pb.Logger.ERROR)
        pb.Logger.log("default msg")
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (logging.INFO, "info msg"),
        (logging.WARNING, "warn msg"),
        (logging.ERROR, "error msg"),
        (logging.DEBUG, "verbose msg"),
        (logging.ERROR, "explicit msg"),
        (logging.INFO, "default msg"),
    ]
    assert all(r.filename == "test_python_utils.py" for r in caplog.records)


def test_installed_under_tritons_module_name() -> None:
    install_utils()
    import triton_python_backend_utils as imported

    assert imported is pb
    assert sys.modules[UTILS_MODULE] is pb


# -- the response sender (Triton's rules, src/response_sender.cc) ---------------------------


def _sender(decoupled: bool, ends_on_error: bool = True) -> tuple[pb.InferenceResponseSender, list]:
    """A sender whose deliveries are recorded as (response, final)."""
    got: list[tuple[pb.InferenceResponse | None, bool]] = []

    def deliver(response: pb.InferenceResponse | None, final: bool) -> bool:
        got.append((response, final))
        return final or (ends_on_error and response is not None and response.has_error())

    return pb.InferenceResponseSender(deliver, decoupled=decoupled, about="model 'm'"), got


def _response(value: float = 1.0) -> pb.InferenceResponse:
    return pb.InferenceResponse(output_tensors=[pb.Tensor("OUT", np.array([value]))])


def test_a_decoupled_sender_sends_many_responses_then_the_final_flag_alone() -> None:
    sender, got = _sender(decoupled=True)
    first, second = _response(1), _response(2)
    sender.send(first)
    sender.send(second)
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert got == [(first, False), (second, False), (None, True)]
    assert pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert not sender.is_cancelled()


def test_a_send_after_the_final_flag_raises_tritons_error_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender, got = _sender(decoupled=True)
    sender.send(_response(), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with caplog.at_level(logging.ERROR, logger="conch.python_model"):
        with pytest.raises(pb.TritonModelException, match="Response sender has been closed"):
            sender.send(_response())
        with pytest.raises(pb.TritonModelException, match="Response sender has been closed"):
            sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert len(got) == 1
    assert "after the final one" in caplog.text and "model 'm'" in caplog.text


@pytest.mark.parametrize(
    ("args", "error", "text"),
    [
        ({"flags": 0}, pb.TritonModelException, "must be provided when the response flags"),
        ({}, pb.TritonModelException, "must be provided when the response flags"),
        ({"response": _response(), "flags": 2}, pb.TritonModelException, "Unsupported flag"),
        ({"response": "not a response"}, TypeError, "InferenceResponse"),
        ({"response": [_response()]}, TypeError, "InferenceResponse"),
    ],
    ids=["no-response-no-flag", "nothing", "bad-flag", "a-string", "a-list"],
)
def test_a_sender_refuses_what_triton_refuses(args: dict, error: type, text: str) -> None:
    sender, got = _sender(decoupled=True)
    with pytest.raises(error, match=text):
        sender.send(**args)
    assert got == []
    sender.send(_response())  # a refused send does not close the sender
    assert len(got) == 1


def test_a_sender_that_is_not_decoupled_sends_one_response_then_the_final_flag() -> None:
    sender, got = _sender(decoupled=False)
    with pytest.raises(pb.TritonModelException, match="cannot send complete final before"):
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    one = _response()
    sender.send(one)
    with pytest.raises(pb.TritonModelException, match="cannot send more than one response"):
        sender.send(_response())
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert got == [(one, False), (None, True)]
    with pytest.raises(pb.TritonModelException, match="has been closed"):
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_a_sender_whose_request_ended_on_an_error_response_is_closed() -> None:
    sender, got = _sender(decoupled=True)
    sender.send(pb.InferenceResponse(error=pb.TritonError("bad")))
    with pytest.raises(pb.TritonModelException, match="has been closed"):
        sender.send(_response())
    assert len(got) == 1


def test_sends_from_many_threads_go_one_at_a_time_in_the_order_taken() -> None:
    import threading

    order: list[int] = []
    busy = threading.Lock()

    def deliver(response: pb.InferenceResponse | None, final: bool) -> bool:
        assert busy.acquire(blocking=False), "two deliveries at once"
        try:
            if response is not None:
                order.append(int(response.output_tensors()[0].as_numpy()[0]))
        finally:
            busy.release()
        return final

    sender = pb.InferenceResponseSender(deliver, decoupled=True)
    threads = [
        threading.Thread(target=lambda k=k: [sender.send(_response(k)) for _ in range(50)])
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert len(order) == 200

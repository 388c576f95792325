"""Config fields Triton honours and conch does not (yet): refused, or named in a warning.

A Triton user's ``config.pbtxt`` may ask for behaviour conch does not build. Silently
ignoring such a field gives that user wrong answers (a model never fed the batch inputs
it declares) or a weaker server than the one they configured, with nothing saying so. So each
field Triton reads and conch does not is listed here once, with what conch does about it:

- ``REFUSE``: ignoring it would change what the model computes, what runs, or where; the
  model's load fails with the reason (it is reported unavailable, the others serve);
- ``WARN``: ignoring it changes only speed or resource use, and results are the same;
  the model serves, and each load logs a warning that names the field.

When conch builds one of these, its row goes away.

``NORMALIZED`` is the other side: what the completed config (``GET
/v2/models/<m>/config``, gRPC ``ModelConfig``) reports as Triton's normalized config
does, though conch does otherwise. Users diff these configs and tools read them, so they
read as Triton's; only a config that sets one of these fields itself is warned about
(``check`` sees the config as written, before completion adds anything).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from conch.core.errors import ModelLoadError

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

# (where, field) pairs already warned about: a polled repository is read again and again,
# and one warning per model and field is enough.
_warned: set[tuple[str, str]] = set()


class Action(Enum):
    REFUSE = "refuse"
    WARN = "warn"


@dataclass(frozen=True)
class Feature:
    """One config field conch does not honour: where it is, and why it matters."""

    field: str  # as a Triton user writes it in config.pbtxt
    action: Action
    why: str  # what ignoring it would do
    present: Callable[[ModelConfig], bool]


def _has(name: str) -> Callable[[ModelConfig], bool]:
    return lambda cfg: cfg.HasField(name)


def _any_group(pred: Callable[[Any], bool]) -> Callable[[ModelConfig], bool]:
    return lambda cfg: any(pred(g) for g in cfg.instance_group)


def _parameter(key: str) -> Callable[[ModelConfig], bool]:
    return lambda cfg: key in cfg.parameters


def _optimization(name: str) -> Callable[[ModelConfig], bool]:
    return lambda cfg: cfg.HasField("optimization") and cfg.optimization.HasField(name)


def _other_cpu_accelerator(cfg: ModelConfig) -> bool:
    """A CPU accelerator but ONNX's "openvino" (which ``conch.backends.onnxruntime`` runs);
    a config naming no backend and no platform is onnxruntime's when its file is ONNX, and
    that backend refuses the accelerator otherwise."""
    if not cfg.HasField("optimization"):
        return False
    accel = cfg.optimization.execution_accelerators.cpu_execution_accelerator
    onnx = cfg.backend in ("onnxruntime", "") and cfg.platform in ("onnxruntime_onnx", "")
    return any(a.name != "openvino" or not onnx for a in accel)


FEATURES: tuple[Feature, ...] = (
    Feature(
        "batch_input",
        Action.REFUSE,
        "conch does not generate Triton's batch inputs (ragged batching): the model would "
        "not get the inputs it declares",
        lambda cfg: len(cfg.batch_input) > 0,
    ),
    Feature(
        "batch_output",
        Action.REFUSE,
        "conch does not scatter Triton's batch outputs",
        lambda cfg: len(cfg.batch_output) > 0,
    ),
    Feature(
        "parameters.EXECUTION_ENV_PATH",
        Action.REFUSE,
        "conch's Python backend runs models in the worker's own Python environment and does "
        "not unpack custom execution environments: install the model's packages into the "
        "worker's environment and remove the parameter",
        _parameter("EXECUTION_ENV_PATH"),
    ),
    Feature(
        "optimization.execution_accelerators.cpu_execution_accelerator",
        Action.REFUSE,
        'conch has one CPU accelerator, "openvino" for ONNX models on onnxruntime (run by '
        "conch's OpenVINO backend); other names and other backends' CPU accelerators would "
        "run without it: remove the field to serve the model without it",
        _other_cpu_accelerator,
    ),
    Feature(
        "model_repository_agents",
        Action.REFUSE,
        "conch runs no repository agents (such as checksum), so the model files would be "
        "served without what the agent does to them",
        _has("model_repository_agents"),
    ),
    Feature(
        "instance_group.passive",
        Action.WARN,
        "conch schedules work on passive instances like any other",
        _any_group(lambda g: g.passive),
    ),
    Feature(
        "instance_group.host_policy",
        Action.WARN,
        "conch applies no host policies (NUMA placement)",
        _any_group(lambda g: bool(g.host_policy)),
    ),
    Feature(
        "optimization.cuda",
        Action.WARN,
        "conch does not capture CUDA graphs nor set CUDA stream priorities",
        _optimization("cuda"),
    ),
    Feature(
        "optimization.input_pinned_memory",
        Action.WARN,
        "conch does not stage inputs in pinned memory",
        _optimization("input_pinned_memory"),
    ),
    Feature(
        "optimization.output_pinned_memory",
        Action.WARN,
        "conch does not stage outputs in pinned memory",
        _optimization("output_pinned_memory"),
    ),
    Feature(
        "optimization.gather_kernel_buffer_threshold",
        Action.WARN,
        "conch gathers batch inputs on the host",
        lambda cfg: (
            cfg.HasField("optimization") and cfg.optimization.gather_kernel_buffer_threshold > 0
        ),
    ),
)


@dataclass(frozen=True)
class Difference:
    """A field of the completed config where what it says and what conch does differ from
    Triton's config, or from Triton's behaviour."""

    field: str
    reported: str  # what the config says, as Triton's would
    conch: str  # what conch does instead


# What the completed config reports, as Triton's would, while conch does otherwise.
NORMALIZED: tuple[Difference, ...] = (
    Difference(
        "optimization.input_pinned_memory",
        "enable: true, when the config says nothing of it (not for ensembles)",
        "inputs are not staged in pinned memory; results are the same",
    ),
    Difference(
        "optimization.output_pinned_memory",
        "enable: true, when the config says nothing of it (not for ensembles)",
        "outputs are not staged in pinned memory; results are the same",
    ),
    Difference(
        "instance_group.count",
        "Triton's default for a group that gives no count: 2 for an onnxruntime or "
        "tensorflow KIND_CPU group, else 1 (per GPU for KIND_GPU)",
        "a worker runs 1 instance of such a group (conch scales out with workers, and "
        "each onnxruntime session has its own thread pool); give a count to run more",
    ),
)


def check(cfg: ModelConfig, where: str) -> list[Feature]:
    """Refuse ``cfg`` (``ModelLoadError`` naming every refused field) or log each ignored one.

    Returns the features that were only warned about, so callers and tests can see them.
    """
    found = [f for f in FEATURES if f.present(cfg)]
    refused = [f for f in found if f.action is Action.REFUSE]
    if refused:
        reasons = "; ".join(f"field {f.field} is not supported: {f.why}" for f in refused)
        raise ModelLoadError(f"{where}: {reasons}")
    for f in found:
        if (where, f.field) not in _warned:
            _warned.add((where, f.field))
            log.warning("%s: field %s is ignored: %s", where, f.field, f.why)
    return found


__all__ = ["FEATURES", "NORMALIZED", "Action", "Difference", "Feature", "check"]

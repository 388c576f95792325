"""A Triton model repository on disk: ``<repo>/<model>/config.pbtxt`` and version folders.

``ModelRepository.scan()`` reads every model, completes its config the way Triton does
(name, platform/backend, default filename, version policy, instance groups, then the
backend's auto-complete, through the ``Completer`` it is given) and checks it. A model
that cannot be served keeps the reason in ``ModelEntry.error``; the others are not
affected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from conch.core import ensemble_graph, sequence, unsupported
from conch.core.backend_table import (
    BACKENDS,
    BackendFacts,
    backend_for_filename,
    backend_for_suffix,
    backend_name_for,
    model_filename,
)
from conch.core.datatypes import config_to_wire
from conch.core.errors import ConchError, InvalidArgument, ModelLoadError, NotFound, Unavailable
from conch.core.model_config import (
    config_to_json,
    json_to_config,
    new_config,
    parse_config,
    response_cache_problem,
)
from conch.core.model_spec import InstanceSpec, ModelSpec
from conch.core.repository_keys import VERSION_NAME, is_model_name, model_name_problem

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"

# Instances a worker runs for a group whose config gives no count. The config reports
# Triton's count (``triton_instance_count``: 2 for an onnxruntime KIND_CPU group), but
# conch runs 1 because a worker has few cores and runs one drain loop per instance, and
# every onnxruntime session already has its own thread pool. Scale out with more workers
# (queue-depth autoscaling) instead. ``unsupported.NORMALIZED`` lists the difference.
DEFAULT_INSTANCE_COUNT = 1
# Triton's default count for a KIND_CPU group of these backends (the others get 1);
# ``SetDefaultInstanceCount`` in triton-inference-server/core src/model_config_utils.cc.
_TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})
# Triton's default-max-batch-size when --backend-config gives none.
DEFAULT_MAX_BATCH_SIZE = 4


def _is_version_dir(path: Path) -> bool:
    # The repository's one rule for version folders (repo_sync writes by it too).
    return VERSION_NAME.fullmatch(path.name) is not None and path.is_dir()


class Completer(Protocol):
    """What the repository needs from the model runtimes, which the core cannot import.

    A composition root hands one in (``conch.backends.completion.complete``), so reading
    a repository imports a runtime (onnxruntime, a Python model's ``model.py``) only in a
    process that chose to complete configs with it.
    """

    def auto_complete(
        self, backend: str, config: ModelConfig, model_file: Path, *, default_max_batch_size: int
    ) -> None:
        """Triton's auto-complete of ``config`` by ``backend`` from its model file; raise
        ``ModelLoadError`` when the config contradicts the model."""
        ...

    def _max_batch_size(self, backend: str) -> int:
        sizes = self.default_max_batch_size
        if isinstance(sizes, int):
            return sizes
        return sizes.get(backend, sizes.get("", DEFAULT_MAX_BATCH_SIZE))

    def gpu_count(self, backend: str) -> int:
        """GPUs an instance of ``backend`` can use in this process (0 without its GPU stack)."""
        ...


@dataclass
class ModelEntry:
    """One model of the repository as read by the last scan."""

    name: str
    path: Path
    config: ModelConfig | None = None  # completed; partial or None when error is set
    error: str | None = None
    versions: list[int] = field(default_factory=list)
    backend: str = ""
    # output name -> class labels, from the output's label_filename (classification)
    output_labels: dict[str, list[str]] = field(default_factory=dict)
    # instance group name -> the instances a worker runs, where that is not the count the
    # config reports (a count Triton's default filled in: DEFAULT_INSTANCE_COUNT)
    run_counts: dict[str, int] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.error is None and self.config is not None and bool(self.versions)

    def _check_available(self) -> None:
        if not self.available:
            raise Unavailable(self.error or f"model '{self.name}' has no version to serve")

    def latest(self) -> int:
        self._check_available()
        return max(self.versions)

    def resolve_version(self, v: str | int | None) -> int:
        """A URL version segment to a served version: "" and "-1" mean the latest."""
        text = "" if v is None else str(v).strip()
        if text in ("", "-1"):
            return self.latest()
        if not text.isdigit() or not text.isascii():
            raise InvalidArgument(
                f"failed to parse model version '{text}' of model '{self.name}': "
                "it must be a non-negative integer"
            )
        version = int(text)
        if version not in self.versions:
            raise NotFound(
                f"Request for unknown model version: '{self.name}' version {version} is not served"
            )
        self._check_available()
        return version

    def spec(self, version: int) -> ModelSpec:
        self._check_available()
        if version not in self.versions:
            raise NotFound(
                f"Request for unknown model version: '{self.name}' version {version} is not served"
            )
        return ModelSpec(name=self.name, version=version, path=self.path, config=self.config)

    def instances(self) -> list[InstanceSpec]:
        """The instances a worker runs for the config's instance groups, named
        ``<group>_<i>``: each group's count, or conch's own where the count was Triton's
        default (``run_counts``)."""
        self._check_available()
        kinds = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL", "KIND_AUTO": "CPU"}
        out = []
        for group in self.config.instance_group:
            kind = kinds[_enum_name(group, "kind", group.kind)]
            devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
            i = 0
            for device in devices:
                for _ in range(max(self.run_counts.get(group.name, group.count), 1)):
                    out.append(InstanceSpec(f"{group.name}_{i}", kind, device))
                    i += 1
        return out

    def labels(self) -> dict[str, list[str]]:
        """Class labels per output, one per line of its ``label_filename``."""
        return self.output_labels

    def to_json(self) -> dict[str, Any]:
        """The completed config as Triton's JSON."""
        if self.config is None:
            raise Unavailable(self.error or f"model '{self.name}' has no config")
        return config_to_json(self.config)

    def metadata(self, version: int | None = None) -> dict[str, Any]:
        """Triton's model metadata; ``version`` None lists every served version."""
        self._check_available()
        if version is not None and version not in self.versions:
            raise NotFound(
                f"Request for unknown model version: '{self.name}' version {version} is not served"
            )
        cfg = self.config
        lead = [-1] if cfg.max_batch_size > 0 else []

        def tensors(entries: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": e.name,
                    "datatype": config_to_wire(_enum_name(e, "data_type", e.data_type)),
                    "shape": lead + list(e.dims),
                }
                for e in entries
            ]

        versions = [version] if version is not None else sorted(self.versions)
        return {
            "name": self.name,
            "versions": [str(v) for v in versions],
            "platform": cfg.platform or cfg.backend,
            "inputs": tensors(cfg.input),
            "outputs": tensors(cfg.output),
        }


def _enum_name(message: Any, field_name: str, value: int) -> str:
    enum = message.DESCRIPTOR.fields_by_name[field_name].enum_type
    return enum.values_by_number[value].name


class ModelRepository:
    """Reads a Triton model repository folder. ``scan()`` may be called again to poll.

    ``complete`` runs the backends' auto-complete and counts the GPUs they can use. Without
    one, a model whose config would be auto-completed (``auto_complete``, any backend but
    an ensemble) reads as broken with a reason that says so, rather than being served from
    a config nobody checked against its model file; and no GPU is counted unless
    ``gpu_count`` says otherwise.

    ``default_max_batch_size`` is the max_batch_size auto-complete gives a model that can
    batch: one for every backend, or by backend name, with "" for the backends not named
    (Triton's ``--backend-config [<backend>,]default-max-batch-size=N``).
    """

    def __init__(
        self,
        root: Path | Sequence[Path],
        *,
        complete: Completer | None = None,
        auto_complete: bool = True,
        default_max_batch_size: int | Mapping[str, int] = DEFAULT_MAX_BATCH_SIZE,
        gpu_count: int | None = None,
        config_override: Callable[[str], str | None] | None = None,
        folder_override: Callable[[str], Path | None] | None = None,
        extra_models: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        # Several repositories serve as one, as Triton's repeated --model-repository does;
        # a model name in more than one of them is an error of that model.
        self.roots = (Path(root),) if isinstance(root, str | Path) else tuple(map(Path, root))
        self.root = self.roots[0]
        self.complete = complete
        self.auto_complete = auto_complete
        # Explicit model control: a config given with a load request (JSON) replaces
        # the model's config.pbtxt.
        self.config_override = config_override
        # ... and its file: overrides replace the model's folder, or add a model.
        self.folder_override = folder_override
        self.extra_models = extra_models
        self.default_max_batch_size = default_max_batch_size
        self._gpu_count = gpu_count

    def _max_batch_size(self, backend: str) -> int:
        sizes = self.default_max_batch_size
        if isinstance(sizes, int):
            return sizes
        return sizes.get(backend, sizes.get("", DEFAULT_MAX_BATCH_SIZE))

    def gpu_count(self, backend: str) -> int:
        """GPUs the backend can use here: the count given to the constructor, else what the
        completer says (the host's visible GPUs when the backend's GPU stack is installed),
        else none."""
        if self._gpu_count is not None:
            return self._gpu_count
        if self.complete is None:
            return 0
        return self.complete.gpu_count(backend)

    def folders(self, name: str) -> list[Path]:
        """Model ``name``'s folders, one for each repository that holds it."""
        return [root / name for root in self.roots if (root / name).is_dir()]

    def folder(self, name: str) -> Path:
        """Model ``name``'s folder: where a repository holds it, else where the first would."""
        return next(iter(self.folders(name)), self.root / name)

    def scan(self) -> dict[str, ModelEntry]:
        names: set[str] = set()
        for root in self.roots:
            if not root.is_dir():
                raise ModelLoadError(f"model repository {root} is not a directory")
            for child in root.iterdir():
                if child.name.startswith(".") or not child.is_dir():
                    continue
                problem = model_name_problem(child.name)
                if problem:
                    log.warning(
                        "model repository %s: skipping %r: not a valid model name: %s",
                        root,
                        child.name,
                        problem,
                    )
                    continue
                names.add(child.name)
        entries: dict[str, ModelEntry] = {name: self.read_model(name) for name in sorted(names)}
        for name in sorted(self.extra_models() if self.extra_models else ()):
            if name not in entries and is_model_name(name):
                entries[name] = self.read_model(name)
        # Ensembles are checked against the models they call, once all are read.
        read = [e for e in entries.values() if e.backend == ensemble_graph.ENSEMBLE and not e.error]
        ensemble_graph.link_all(entries)
        for entry in read:
            if entry.error:
                log.warning("%s", entry.error)
        return entries

    def read_model(self, name: str) -> ModelEntry:
        """Read and complete one model; failures land in ``error``, never raise."""
        folder = self.folder_override(name) if self.folder_override else None
        entry = ModelEntry(name=name, path=folder or self.folder(name))
        try:
            found = self.folders(name)
            if folder is None and len(found) > 1:
                raise ModelLoadError(
                    f"model '{name}' is in more than one model repository "
                    f"({', '.join(str(f.parent) for f in found)}): a name must be unique "
                    "across them"
                )
            self._read(entry)
        except ConchError as exc:
            entry.error = exc.message
        except Exception as exc:  # a model must never break the scan of the others
            log.exception("model '%s': unexpected error while reading it", name)
            entry.error = f"model '{name}': {type(exc).__name__}: {exc}"
        if entry.error:
            log.warning("%s", entry.error)
        return entry

    # -- completion -------------------------------------------------------------------

    def _read(self, entry: ModelEntry) -> None:
        name, path = entry.name, entry.path
        config_path = path / CONFIG_FILE
        if not path.is_dir():  # a name a client made up (an unload, a load's steps)
            raise ModelLoadError(f"model '{name}' is not in the model repository")
        on_disk = sorted(int(p.name) for p in path.iterdir() if _is_version_dir(p))
        override = self.config_override(name) if self.config_override else None
        if override is not None:
            cfg = json_to_config(override, model=name)
            where = f"model '{name}' (config from its load request)"
        elif config_path.is_file():
            try:
                text = config_path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"model '{name}': cannot read {config_path}: {exc}") from None
            cfg = parse_config(text, model=name, source=str(config_path))
            where = f"model '{name}' ({config_path})"
        else:
            cfg = new_config()
            where = f"model '{name}' (no {CONFIG_FILE}, auto-completed)"
        entry.config = cfg

        if cfg.name and cfg.name != name:
            raise ModelLoadError(
                f"{where}: field name is '{cfg.name}' but the model directory is '{name}'"
            )
        cfg.name = name
        unsupported.check(cfg, where)

        if ensemble_graph.ENSEMBLE in (cfg.platform, cfg.backend):
            self._read_ensemble(entry, cfg, on_disk, where)
            return
        entry.backend = self._backend(cfg, path, on_disk, where)
        registered = BACKENDS[entry.backend]
        platform_known = bool(cfg.platform) or not cfg.backend
        if not cfg.backend:
            cfg.backend = entry.backend
        if not cfg.platform and registered.platforms:
            cfg.platform = registered.platform_for(
                cfg.default_model_filename or _model_file_present(registered, path, on_disk)
            )
        # A file named by a parameter (FIL's model_type) is the backend's own choice:
        # Triton writes no file name for a backend it does not know (a custom backend).
        if (
            not cfg.default_model_filename
            and not registered.filename_parameter
            and (registered.filename_with_platform or not platform_known)
        ):
            cfg.default_model_filename = model_filename(cfg)

        if not cfg.HasField("version_policy"):
            cfg.version_policy.latest.num_versions = 1
        entry.versions = self._versions(cfg, on_disk, where, path)
        filename = model_filename(cfg)  # "": a backend that reads no file (identity)
        for v in entry.versions:
            if filename and not (path / str(v) / filename).exists():
                raise ModelLoadError(
                    f"model '{name}' version {v}: model file {path / str(v) / filename} not found"
                )

        entry.run_counts = self._instance_groups(cfg, where, entry.backend)

        if self.auto_complete:
            model_file = path / str(max(entry.versions)) / model_filename(cfg)
            if self.complete is None:
                raise ModelLoadError(
                    f"{where}: its config is to be auto-completed, but this repository was "
                    "opened without a completer (ModelRepository(complete=...)); the process "
                    "that reads it must pass one, or turn auto-complete off"
                )
            try:
                self.complete.auto_complete(
                    entry.backend,
                    cfg,
                    model_file,
                    default_max_batch_size=self._max_batch_size(entry.backend),
                )
            except ModelLoadError as exc:
                source = config_path if config_path.is_file() else f"no {CONFIG_FILE}"
                raise ModelLoadError(
                    f"{exc.message} (config: {source}; model file: {model_file})"
                ) from None

        _normalize(cfg)
        _validate(cfg, where)
        try:
            sequence.check(cfg, entry.backend)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{where}: {exc.message}") from None
        entry.output_labels = _read_labels(cfg, path, where)

    def _backend(self, cfg: ModelConfig, path: Path, on_disk: list[int], where: str) -> str:
        if cfg.backend or cfg.platform:
            try:
                name = backend_name_for(cfg.platform, cfg.backend)
            except ModelLoadError as exc:
                raise ModelLoadError(f"{where}: {exc.message}") from None
            platforms = BACKENDS[name].platforms
            if cfg.backend and cfg.platform and cfg.platform not in platforms:
                raise ModelLoadError(
                    f"{where}: field platform '{cfg.platform}' does not go with backend "
                    f"'{cfg.backend}' (which serves {list(platforms) or 'no platform'})"
                )
            return name
        found: dict[str, str] = {}
        for v in on_disk:
            for item in (path / str(v)).iterdir():
                backend = backend_for_filename(item.name)
                if backend is None and cfg.default_model_filename == item.name:
                    backend = backend_for_suffix(item.name)
                if backend is not None:
                    found.setdefault(backend, item.name)
        if len(found) == 1:
            return next(iter(found))
        if found:
            raise ModelLoadError(
                f"{where}: cannot tell the backend from the model files "
                f"{sorted(found.values())}; set field backend or platform"
            )
        defaults = sorted(e.default_filename for e in BACKENDS.values() if e.default_filename)
        raise ModelLoadError(
            f"{where}: no field platform or backend, and no known model file ({', '.join(defaults)}) "
            f"in the version directories {on_disk or '(none)'}"
        )

    def _read_ensemble(
        self, entry: ModelEntry, cfg: ModelConfig, on_disk: list[int], where: str
    ) -> None:
        """Ensembles have no model file and no instances: the gateway runs their steps."""
        entry.backend = ensemble_graph.ENSEMBLE
        cfg.platform, cfg.backend = ensemble_graph.ENSEMBLE, ""
        if cfg.instance_group:
            raise ModelLoadError(f"{where}: an ensemble may not set instance_group")
        if not cfg.ensemble_scheduling.step:
            raise ModelLoadError(f"{where}: platform ensemble needs ensemble_scheduling with steps")
        if not cfg.HasField("version_policy"):
            cfg.version_policy.latest.num_versions = 1
        entry.versions = self._versions(cfg, on_disk, where, entry.path)
        _validate(cfg, where)
        entry.output_labels = _read_labels(cfg, entry.path, where)

    def _versions(self, cfg: ModelConfig, on_disk: list[int], where: str, path: Path) -> list[int]:
        policy = cfg.version_policy
        kind = policy.WhichOneof("policy_choice")
        if kind == "all":
            chosen = list(on_disk)
        elif kind == "specific":
            wanted = sorted(set(policy.specific.versions))
            missing = [v for v in wanted if v not in on_disk]
            if missing:
                raise ModelLoadError(
                    f"{where}: field version_policy.specific asks for version(s) {missing}, "
                    f"not present in {path} (found {on_disk or 'none'})"
                )
            chosen = wanted
        else:
            n = policy.latest.num_versions
            if n < 1:
                raise ModelLoadError(
                    f"{where}: field version_policy.latest.num_versions must be at least 1, got {n}"
                )
            chosen = on_disk[-n:]
        if not chosen:
            raise ModelLoadError(
                f"{where}: at least one version must be available under the version policy; "
                f"no numeric version directory in {path}"
            )
        return chosen

    def _instance_groups(self, cfg: ModelConfig, where: str, backend: str) -> dict[str, int]:
        """Triton's instance groups (``NormalizeInstanceGroup``): a name, a kind, a count
        and GPUs for each. Returns the groups whose instances conch runs differently from
        the count reported (a count left to Triton's default)."""
        pb2_group = cfg.DESCRIPTOR.fields_by_name["instance_group"].message_type
        kind_enum = pb2_group.fields_by_name["kind"].enum_type.values_by_name
        gpus = self.gpu_count(backend)
        run_counts: dict[str, int] = {}
        if not cfg.instance_group:
            # Triton's default: one group named after the model; its instances are
            # then "<model>_0", "<model>_1", ...
            cfg.instance_group.add().name = cfg.name
        for i, group in enumerate(cfg.instance_group):
            if not group.name:
                group.name = f"{cfg.name}_{i}"
            if group.count < 0:
                raise ModelLoadError(
                    f"{where}: instance_group '{group.name}' field count must be positive"
                )
            if group.kind == kind_enum["KIND_AUTO"].number:
                group.kind = kind_enum["KIND_GPU" if gpus else "KIND_CPU"].number
            if group.count == 0:
                # The kind is known now, and Triton's default count depends on it.
                kind = _enum_name(group, "kind", group.kind)
                group.count = triton_instance_count(kind, backend)
                if group.count != DEFAULT_INSTANCE_COUNT:
                    run_counts[group.name] = DEFAULT_INSTANCE_COUNT
            if group.kind == kind_enum["KIND_GPU"].number and not group.gpus and gpus:
                group.gpus.extend(range(gpus))
            if group.kind != kind_enum["KIND_GPU"].number and group.gpus:
                raise ModelLoadError(
                    f"{where}: instance_group '{group.name}' sets field gpus but is not KIND_GPU"
                )
        return run_counts


def _model_file_present(facts: BackendFacts, path: Path, on_disk: list[int]) -> str:
    """Which of a backend's per-platform model files the newest version holds ("" for none),
    so a TensorFlow model with no platform is a SavedModel or a GraphDef by its file, as
    Triton decides (``AutoCompleteBackendFields``)."""
    for _, filename in facts.platform_filenames:
        if on_disk and (path / str(on_disk[-1]) / filename).exists():
            return filename
    return ""


def triton_instance_count(kind: str, backend: str) -> int:
    """Triton's count for an instance group that gives none (per GPU for KIND_GPU): 2 for a
    KIND_CPU group of onnxruntime (and tensorflow), else 1."""
    return 2 if kind == "KIND_CPU" and backend in _TWO_CPU_INSTANCES else 1


def _normalize(cfg: ModelConfig) -> None:
    """What Triton fills in after any auto-complete (on or off; ``NormalizeModelConfig``
    in triton-inference-server/core src/model_config_utils.cc): a dynamic batcher with no
    ``preferred_batch_size`` prefers full batches, and a model (not an ensemble) that
    says nothing of pinned memory has it on for inputs and outputs. conch stages nothing
    in pinned memory; the config says what Triton's would (``unsupported.NORMALIZED``),
    and only a config that asks for it itself is warned about (``unsupported.check`` runs
    on the config as written). The scheduler itself is the backend's to add
    (``Backend.auto_complete``); a config with none runs on the default scheduler, each
    request on its own."""
    optimization = cfg.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    batcher = cfg.dynamic_batching
    if (
        cfg.HasField("dynamic_batching")
        and cfg.max_batch_size > 0
        and not batcher.preferred_batch_size
    ):
        batcher.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        # Triton's defaults for a sequence model, so its config reads as Triton's does.
        sb = cfg.sequence_batching
        if not sb.max_sequence_idle_microseconds:
            sb.max_sequence_idle_microseconds = sequence.DEFAULT_IDLE_US
        if sb.HasField("oldest") and cfg.max_batch_size > 0 and not sb.oldest.preferred_batch_size:
            sb.oldest.preferred_batch_size.append(cfg.max_batch_size)


def _read_labels(cfg: ModelConfig, path: Path, where: str) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    for out in cfg.output:
        if not out.label_filename:
            continue
        label_path = path / out.label_filename
        try:
            text = label_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(
                f"{where}: output '{out.name}' field label_filename: cannot read {label_path}: {exc}"
            ) from None
        labels[out.name] = text.splitlines()
    return labels


def _validate(cfg: ModelConfig, where: str) -> None:
    problem = response_cache_problem(cfg)
    if problem:
        raise ModelLoadError(f"{where}: {problem}")
    if cfg.max_batch_size < 0:
        raise ModelLoadError(
            f"{where}: field max_batch_size must be >= 0, got {cfg.max_batch_size}"
        )
    for what, entries in (("input", cfg.input), ("output", cfg.output)):
        seen: set[str] = set()
        for i, e in enumerate(entries):
            if not e.name:
                raise ModelLoadError(f"{where}: {what}[{i}] field name is empty")
            if e.name in seen:
                raise ModelLoadError(f"{where}: {what} '{e.name}' is listed twice")
            seen.add(e.name)
            if e.data_type == 0:
                raise ModelLoadError(f"{where}: {what} '{e.name}' field data_type is not set")
            if not e.dims:
                raise ModelLoadError(
                    f"{where}: {what} '{e.name}' field dims is empty; a scalar is "
                    "dims: [ 1 ] with reshape: { shape: [ ] }"
                )
            if any(d < -1 or d == 0 for d in e.dims):
                raise ModelLoadError(
                    f"{where}: {what} '{e.name}' field dims {list(e.dims)} holds a value that is "
                    "neither -1 (variable) nor positive"
                )
            if e.HasField("reshape") and any(d < -1 or d == 0 for d in e.reshape.shape):
                raise ModelLoadError(
                    f"{where}: {what} '{e.name}' field reshape.shape {list(e.reshape.shape)} "
                    "holds a value that is neither -1 nor positive"
                )


__all__ = [
    "CONFIG_FILE",
    "DEFAULT_INSTANCE_COUNT",
    "Completer",
    "ModelEntry",
    "ModelRepository",
    "triton_instance_count",
]

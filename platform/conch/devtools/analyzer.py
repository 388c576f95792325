"""``conch analyze``'s sweep: a model's batching and instance settings measured, ranked and
drawn (the CLI, ``conch.cli.analyze``, only parses flags and prints).

The grid is the product of the axes asked for (``max_batch_size``, the dynamic batcher's
``max_queue_delay_microseconds`` and ``preferred_batch_size``, the instance count), each
axis not asked for held at the model's own value; the model's own config (the *default*)
is always measured first, as the baseline. Each configuration is a private copy of the
model's folder (its ``config.pbtxt`` altered, every other entry a symbolic link, so no
model file is copied), served by one ``conch worker`` and one ``conch gateway`` on a
private Redis (a Unix socket, emptied between configurations), and driven by Triton's
perf_analyzer at each concurrency. The best configuration is the one with the highest
throughput at a concurrency whose p99 latency is within the budget (Triton's Model
Analyzer's ``--latency-budget``).
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shlex
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from conch.core.model_config import parse_config

if TYPE_CHECKING:
    from conch.core.model_config import ModelConfig

# A model config's parameter that chooses its instances' form (conch.worker.host's
# INSTANCE_FORM_PARAMETER, not imported: that module loads the worker).
INSTANCE_FORM_PARAMETER = "instance_form"
INSTANCE_FORMS = ("thread", "process")
MAX_CONFIGS = 64  # the grid's bound (the default included)
READY_TIMEOUT_S = 180.0  # a configuration's worker and gateway, until the model is ready
FALLBACK_STABILITY_PCT = 999  # a point not stable at the asked percentage: measured anyway


class AnalyzeError(RuntimeError):
    """What the user asked for cannot be analyzed (the message says why)."""


@dataclass(frozen=True)
class Candidate:
    """One configuration of the grid: the values the sweep sets (``delay_us`` None: no
    dynamic batcher; ``form`` "": the config's own or the worker's default)."""

    max_batch_size: int
    delay_us: int | None
    preferred: tuple[int, ...]
    instances: int
    form: str = ""
    default: bool = False

    @property
    def knobs(self) -> tuple[int, int | None, tuple[int, ...], int, str]:
        return (self.max_batch_size, self.delay_us, self.preferred, self.instances, self.form)

    @property
    def label(self) -> str:
        delay = "off" if self.delay_us is None else f"{self.delay_us}us"
        pref = "+".join(map(str, self.preferred)) or "-"
        form = f"x{self.form}" if self.form else ""
        text = f"mbs={self.max_batch_size} delay={delay} pref={pref} inst={self.instances}{form}"
        return f"default ({text})" if self.default else text

    def settings(self) -> dict[str, object]:
        return {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_microseconds": self.delay_us,
            "preferred_batch_size": list(self.preferred),
            "instance_count": self.instances,
            "instance_form": self.form or None,
        }


def _instances(cfg: ModelConfig) -> int:
    return cfg.instance_group[0].count or 1 if cfg.instance_group else 1


def from_config(cfg: ModelConfig) -> Candidate:
    """The model's own configuration as a candidate: the default."""
    batcher = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    param = cfg.parameters.get(INSTANCE_FORM_PARAMETER)
    return Candidate(
        max_batch_size=cfg.max_batch_size,
        delay_us=batcher.max_queue_delay_microseconds if batcher is not None else None,
        preferred=tuple(batcher.preferred_batch_size) if batcher is not None else (),
        instances=_instances(cfg),
        form=param.string_value.strip().lower() if param is not None else "",
        default=True,
    )


def check_model(cfg: ModelConfig, model: str) -> None:
    """Refuse what this sweep cannot drive: ensembles (no instances or batcher of their
    own), sequence models and decoupled models (perf_analyzer needs other flags)."""
    if cfg.platform == "ensemble" or cfg.backend == "ensemble":
        raise AnalyzeError(f"model '{model}' is an ensemble: analyze its composing models")
    if cfg.HasField("sequence_batching"):
        raise AnalyzeError(
            f"model '{model}' is a sequence model: conch analyze sweeps dynamic batching"
        )
    if cfg.model_transaction_policy.decoupled:
        raise AnalyzeError(
            f"model '{model}' is decoupled: conch analyze drives one answer a request"
        )


def build_grid(
    base: Candidate,
    *,
    max_batch_sizes: Sequence[int] = (),
    delays_us: Sequence[int] = (),
    preferred: Sequence[tuple[int, ...]] = (),
    instance_counts: Sequence[int] = (),
    form: str = "",
    limit: int = MAX_CONFIGS,
) -> tuple[list[Candidate], list[str]]:
    """The default first, then each other combination of the axes (an empty axis: the
    default's value) once; and why each combination left out was left out.

    A model that does not batch (``max_batch_size`` 0) is swept on its instance count only;
    a preferred size above the maximum batch size is left out; more than ``limit``
    configurations is an ``AnalyzeError``.
    """
    if form and form not in INSTANCE_FORMS:
        raise AnalyzeError(f"--instance-form must be one of {', '.join(INSTANCE_FORMS)}")
    for name, values, least in (
        ("--max-batch-sizes", max_batch_sizes, 1),
        ("--queue-delays-us", delays_us, 0),
        ("--instance-counts", instance_counts, 1),
    ):
        if any(v < least for v in values):
            raise AnalyzeError(f"{name}: every value must be at least {least}")
    if any(p < 1 for sizes in preferred for p in sizes):
        raise AnalyzeError("--preferred-batch-sizes: every size must be at least 1")
    skipped: list[str] = []
    if base.max_batch_size == 0 and (max_batch_sizes or delays_us or preferred):
        skipped.append(
            "the model does not batch (max_batch_size 0): only its instance count is swept"
        )
        max_batch_sizes, delays_us, preferred = (), (), ()
    grid = [base]
    seen = {base.knobs}
    for mbs, delay, pref, count in product(
        max_batch_sizes or [base.max_batch_size],
        delays_us or [base.delay_us],
        preferred or [base.preferred],
        instance_counts or [base.instances],
    ):
        pref = tuple(sorted(set(pref)))
        candidate = Candidate(mbs, delay, pref, count, form or base.form)
        if candidate.knobs in seen:
            continue
        seen.add(candidate.knobs)
        if pref and max(pref) > mbs:
            skipped.append(f"{candidate.label}: a preferred batch size above max_batch_size")
            continue
        if pref and delay is None:
            skipped.append(f"{candidate.label}: preferred batch sizes need a dynamic batcher")
            continue
        grid.append(candidate)
    if len(grid) > limit:
        raise AnalyzeError(
            f"the grid has {len(grid)} configurations, more than {limit}: give fewer values"
        )
    return grid, skipped


def apply(cfg: ModelConfig, candidate: Candidate) -> ModelConfig:
    """A copy of ``cfg`` with ``candidate``'s values (the instance count set on each of its
    instance groups, or on a new group of the default kind when it has none)."""
    out = type(cfg)()
    out.CopyFrom(cfg)
    if candidate.default:
        return out
    out.max_batch_size = candidate.max_batch_size
    if candidate.delay_us is None:
        out.ClearField("dynamic_batching")
    else:
        out.dynamic_batching.max_queue_delay_microseconds = candidate.delay_us
        del out.dynamic_batching.preferred_batch_size[:]
        out.dynamic_batching.preferred_batch_size.extend(candidate.preferred)
    if not out.instance_group:
        out.instance_group.add()
    for group in out.instance_group:
        group.count = candidate.instances
    if candidate.form:
        out.parameters[INSTANCE_FORM_PARAMETER].string_value = candidate.form
    return out


def config_text(cfg: ModelConfig) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def stage(model_dir: Path, cfg: ModelConfig, repo: Path) -> Path:
    """``repo``/<model>: ``cfg`` as its config.pbtxt, every other entry of ``model_dir`` a
    symbolic link to the original (nothing big is copied)."""
    dest = repo / model_dir.name
    dest.mkdir(parents=True)
    for entry in model_dir.iterdir():
        if entry.name != "config.pbtxt" and not entry.name.startswith("config.pbtxt."):
            (dest / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    (dest / "config.pbtxt").write_text(config_text(cfg))
    return dest


@dataclass
class Point:
    """One concurrency of one configuration, as perf_analyzer measured it."""

    concurrency: int
    infer_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    error: str = ""  # "" measured; else why not (or, with numbers, why they are rough)
    unstable: bool = False

    @property
    def measured(self) -> bool:
        return self.infer_per_s > 0

    def meets(self, budget_ms: float | None) -> bool:
        return self.measured and (budget_ms is None or self.p99_ms <= budget_ms)


@dataclass
class Result:
    candidate: Candidate
    points: list[Point] = field(default_factory=list)
    error: str = ""  # the configuration did not serve (why)
    seconds: float = 0.0

    def best(self, budget_ms: float | None) -> Point | None:
        """The highest throughput among its points within the budget (on a tie, the lower p99)."""
        ok = [p for p in self.points if p.meets(budget_ms)]
        return max(ok, key=lambda p: (p.infer_per_s, -p.p99_ms)) if ok else None


def rank(results: Iterable[Result], budget_ms: float | None) -> list[tuple[Result, Point]]:
    """The configurations with a point within the budget, best first: highest throughput
    within it, then lower p99, then the default before the others (a tie keeps it)."""
    ranked = [(r, b) for r in results if (b := r.best(budget_ms)) is not None]
    ranked.sort(key=lambda rb: (-rb[1].infer_per_s, rb[1].p99_ms, not rb[0].candidate.default))
    return ranked


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AnalyzeError(f"{flag}: comma-separated integers, not {text!r}") from None


def parse_preferred(text: str) -> list[tuple[int, ...]]:
    """``--preferred-batch-sizes``: choices separated by commas, each ``none`` or sizes
    joined by ``+`` (``none,8,4+8``)."""
    out: list[tuple[int, ...]] = []
    for choice in (c.strip() for c in text.split(",")):
        if not choice:
            continue
        if choice.lower() in ("none", "-"):
            out.append(())
            continue
        try:
            out.append(tuple(int(v) for v in choice.split("+")))
        except ValueError:
            raise AnalyzeError(
                f"--preferred-batch-sizes: 'none' or sizes joined by '+' (4+8), not {choice!r}"
            ) from None
    return out


# ---- serving and measuring ---------------------------------------------------------


@dataclass
class Served:
    url: str
    processes: list[subprocess.Popen]

    def stop(self) -> None:
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def serve(repo: Path, model: str, redis_url: str, logs: Path, tag: str) -> Served:
    """One worker and one gateway (loopback, a free port) on ``repo``, ``model`` ready."""
    from conch.devtools import processes
    from conch.devtools.redis_server import free_port

    logs.mkdir(parents=True, exist_ok=True)
    common = ["--model-repository", str(repo), "--redis-url", redis_url]
    port = free_port()
    started: list[subprocess.Popen] = []
    served = Served(f"127.0.0.1:{port}", started)
    try:
        for role, extra in (
            ("worker", ["--models", model]),
            (
                "gateway",
                [
                    "--http-address",
                    "127.0.0.1",
                    "--http-port",
                    str(port),
                    "--metrics-port",
                    str(free_port()),
                ],
            ),
        ):
            with open(logs / f"{tag}-{role}.log", "wb") as log_file:
                started.append(processes.spawn(processes.conch(role, *common, *extra), log_file))

        def watch() -> None:
            for role, proc in zip(("worker", "gateway"), started, strict=True):
                if proc.poll() is not None:
                    tail = (logs / f"{tag}-{role}.log").read_text(errors="replace")[-1500:]
                    raise AnalyzeError(f"conch {role} exited with {proc.returncode}:\n{tail}")

        ready = f"http://{served.url}/v2/models/{model}/ready"
        if not processes.wait_until(
            lambda: _answers(ready), READY_TIMEOUT_S, watch=watch, every=0.25
        ):
            raise AnalyzeError(f"model '{model}' not ready within {READY_TIMEOUT_S:.0f} s")
    except BaseException:
        served.stop()
        raise
    return served


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class PaSettings:
    binary: str
    window_ms: int = 1000
    stability_pct: int = 25
    max_trials: int = 6
    extra: tuple[str, ...] = ()


def measure(pa: PaSettings, url: str, model: str, concurrency: int, out: Path) -> Point:
    """perf_analyzer at one concurrency over HTTP; not stable at ``pa.stability_pct``
    within its windows: measured again taking any three windows (marked unstable)."""
    from conch.devtools import perf_analyzer

    point = Point(concurrency)
    for attempt, stability in enumerate((pa.stability_pct, FALLBACK_STABILITY_PCT)):
        args = perf_analyzer.window_args(
            model,
            url,
            "http",
            concurrency,
            window_ms=pa.window_ms,
            stability_pct=stability,
            max_trials=pa.max_trials,
        )
        args += pa.extra
        csv_path = out / f"pa-c{concurrency}{'-retry' if attempt else ''}.csv"
        timeout = pa.window_ms / 1000 * (pa.max_trials + 2) + 60
        ran = perf_analyzer.run(pa.binary, args, csv_path, timeout_s=timeout)
        if ran.code is None:
            point.error = f"perf_analyzer timed out after {timeout:.0f} s"
            return point
        if ran.code == 0 and ran.rows:
            row = ran.rows[-1]
            point.infer_per_s = float(row["Inferences/Second"])
            point.p50_ms = float(row["p50 latency"]) / 1000
            point.p99_ms = float(row["p99 latency"]) / 1000
            point.unstable = attempt > 0
            point.error = f"not stable within {pa.stability_pct}%" if attempt else ""
            return point
        last = [line for line in ran.output.splitlines() if line.strip()][-3:]
        point.error = " / ".join(last)[-300:] or f"perf_analyzer exited with {ran.code}"
    return point


@dataclass
class Sweep:
    """What a sweep measured and what it did not (the budget ran out)."""

    model: str
    budget_ms: float | None
    results: list[Result] = field(default_factory=list)
    not_measured: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ranked(self) -> list[tuple[Result, Point]]:
        return rank(self.results, self.budget_ms)

    def to_json(self) -> dict[str, object]:
        ranked = self.ranked
        places = {id(r): i + 1 for i, (r, _) in enumerate(ranked)}
        return {
            "model": self.model,
            "latency_budget_ms": self.budget_ms,
            "seconds": round(self.seconds, 1),
            "best": ranked[0][0].candidate.label if ranked else None,
            "configs": [
                {
                    "label": r.candidate.label,
                    "default": r.candidate.default,
                    "settings": r.candidate.settings(),
                    "rank": places.get(id(r)),
                    "error": r.error,
                    "seconds": round(r.seconds, 1),
                    "best": asdict(b) if (b := r.best(self.budget_ms)) else None,
                    "points": [
                        {**asdict(p), "meets_budget": p.meets(self.budget_ms)} for p in r.points
                    ],
                }
                for r in self.results
            ],
            "not_measured": [c.label for c in self.not_measured],
            "skipped": self.skipped,
        }


def run_sweep(
    model_dir: Path,
    grid: Sequence[Candidate],
    cfg: ModelConfig,
    *,
    concurrencies: Sequence[int],
    pa: PaSettings,
    out: Path,
    budget_s: float,
    budget_ms: float | None,
    skipped: Sequence[str] = (),
    say: Callable[[str], None] = print,
    progress: bool = True,
) -> Sweep:
    """Serve and measure each configuration of ``grid`` in turn (the first, the default,
    always). A configuration is not started when the time it would take (the slowest
    one so far) would pass ``budget_s``: it is listed as not measured."""
    from tqdm import tqdm

    from conch.devtools import redis_server

    model = model_dir.name
    sweep = Sweep(model, budget_ms, skipped=list(skipped))
    t0 = time.monotonic()
    private = redis_server.start_private(unix_socket=True)
    bar = tqdm(total=len(grid), desc=f"analyze {model}", unit="config", disable=not progress)
    try:
        import redis

        for index, candidate in enumerate(grid):
            elapsed = time.monotonic() - t0
            slowest = max((r.seconds for r in sweep.results), default=0.0)
            if sweep.results and elapsed + slowest > budget_s:
                sweep.not_measured = list(grid[index:])
                bar.write(
                    f"--budget-s {budget_s:g}: {len(sweep.not_measured)} configurations not "
                    f"measured ({elapsed:.0f} s spent, the slowest took {slowest:.0f} s)"
                )
                break
            bar.set_postfix_str(candidate.label)
            sweep.results.append(
                _one(index, candidate, model_dir, cfg, concurrencies, pa, out, private.url, bar)
            )
            redis.Redis.from_url(private.url).flushall()
            bar.update()
    finally:
        bar.close()
        private.stop()
        sweep.seconds = time.monotonic() - t0
    return sweep


def _one(
    index: int,
    candidate: Candidate,
    model_dir: Path,
    cfg: ModelConfig,
    concurrencies: Sequence[int],
    pa: PaSettings,
    out: Path,
    redis_url: str,
    bar: object,
) -> Result:
    t0 = time.monotonic()
    result = Result(candidate)
    where = out / "configs" / f"{index:02d}"
    stage(model_dir, apply(cfg, candidate), where / "repo")
    try:
        served = serve(where / "repo", model_dir.name, redis_url, where / "logs", "conch")
    except AnalyzeError as exc:
        result.error = str(exc)
        bar.write(f"{candidate.label}: did not serve: {exc}")  # type: ignore[attr-defined]
        result.seconds = time.monotonic() - t0
        return result
    try:
        for c in concurrencies:
            point = measure(pa, served.url, model_dir.name, c, where)
            result.points.append(point)
            shown = (
                f"{point.infer_per_s:9.1f} infer/s  p50 {point.p50_ms:7.2f} ms  p99 {point.p99_ms:7.2f} ms"
                if point.measured
                else f"not measured: {point.error}"
            )
            bar.write(f"{candidate.label} @ {c}: {shown}")  # type: ignore[attr-defined]
    finally:
        served.stop()
    result.seconds = time.monotonic() - t0
    return result


# ---- reporting ---------------------------------------------------------------------


def table(sweep: Sweep) -> str:
    """Every configuration's points: the ranked ones first (best first), then the rest."""
    budget = sweep.budget_ms
    ranked = sweep.ranked
    places = {id(r): i + 1 for i, (r, _) in enumerate(ranked)}
    order = [r for r, _ in ranked] + [r for r in sweep.results if id(r) not in places]
    width = max([len(r.candidate.label) for r in order] + [6])
    head = f"{'rank':>4}  {'config':<{width}}  {'conc':>4}  {'infer/s':>9}  {'p50 ms':>8}  {'p99 ms':>8}  meets"
    lines = [head, "-" * len(head)]
    for r in order:
        best = r.best(budget)
        place = str(places[id(r)]) if id(r) in places else "-"
        if r.error:
            lines.append(f"{place:>4}  {r.candidate.label:<{width}}  did not serve")
        for i, p in enumerate(r.points):
            mark = "yes" if p.meets(budget) else "no"
            if p is best:
                mark += " *"
            if p.unstable:
                mark += " (unstable)"
            if not p.measured:
                lines.append(
                    f"{place if i == 0 else '':>4}  {r.candidate.label if i == 0 else '':<{width}}  "
                    f"{p.concurrency:>4}  {'-':>9}  {'-':>8}  {'-':>8}  not measured: {p.error[:60]}"
                )
                continue
            lines.append(
                f"{place if i == 0 else '':>4}  {r.candidate.label if i == 0 else '':<{width}}  "
                f"{p.concurrency:>4}  {p.infer_per_s:>9.1f}  {p.p50_ms:>8.2f}  {p.p99_ms:>8.2f}  {mark}"
            )
    return "\n".join(lines)


def summary(sweep: Sweep) -> str:
    budget = (
        f"within p99 <= {sweep.budget_ms:g} ms"
        if sweep.budget_ms is not None
        else "(no latency budget)"
    )
    lines = []
    ranked = sweep.ranked
    default = next((r for r in sweep.results if r.candidate.default), None)
    if ranked:
        best, point = ranked[0]
        lines.append(
            f"best {budget}: {best.candidate.label}: {point.infer_per_s:.1f} infer/s at "
            f"concurrency {point.concurrency} (p99 {point.p99_ms:.2f} ms)"
        )
        base = default.best(sweep.budget_ms) if default else None
        if base is not None and base.infer_per_s > 0 and not best.candidate.default:
            lines.append(
                f"the default within it: {base.infer_per_s:.1f} infer/s "
                f"({point.infer_per_s / base.infer_per_s:.2f}x)"
            )
    else:
        lines.append(f"no configuration measured {budget}")
    for c in sweep.not_measured:
        lines.append(f"not measured (--budget-s): {c.label}")
    lines.extend(f"left out: {s}" for s in sweep.skipped)
    return "\n".join(lines)


def picture(sweep: Sweep, path: Path) -> bool:
    """Throughput against p99 latency, a line per configuration through its concurrencies,
    the budget a vertical line; False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = sweep.ranked
    best = ranked[0][0] if ranked else None
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=90)
    for r in sweep.results:
        points = sorted((p for p in r.points if p.measured), key=lambda p: p.concurrency)
        if not points:
            continue
        xs, ys = [p.p99_ms for p in points], [p.infer_per_s for p in points]
        style: dict[str, object] = {"marker": "o", "linewidth": 1.2, "markersize": 4}
        if r.candidate.default:
            style.update(color="black", linestyle="--", linewidth=1.8)
        if r is best:
            style.update(linewidth=2.8, markersize=6)
        label = ("best: " if r is best else "") + r.candidate.label
        (line,) = ax.plot(xs, ys, label=label, **style)
        for p in points:
            ax.annotate(
                str(p.concurrency),
                (p.p99_ms, p.infer_per_s),
                textcoords="offset points",
                xytext=(3, 3),
                fontsize=7,
                color=line.get_color(),
            )
    if sweep.budget_ms is not None:
        ax.axvline(sweep.budget_ms, color="red", linestyle=":", linewidth=1.5)
        ax.annotate(
            f"budget {sweep.budget_ms:g} ms",
            (sweep.budget_ms, 0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, 6),
            textcoords="offset points",
            rotation=90,
            ha="right",
            va="bottom",
            fontsize=8,
            color="red",
        )
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title(f"conch analyze {sweep.model}: throughput against p99 (labels: concurrency)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def html_page(sweep: Sweep, png: Path | None, path: Path) -> None:
    img = f'<img src="{html.escape(png.name)}" alt="throughput against p99">' if png else ""
    path.write_text(
        "<!doctype html><meta charset=utf-8>"
        f"<title>conch analyze {html.escape(sweep.model)}</title>"
        f"<h1>conch analyze {html.escape(sweep.model)}</h1>{img}"
        f"<pre>{html.escape(table(sweep))}\n\n{html.escape(summary(sweep))}</pre>\n"
    )


def save_json(sweep: Sweep, path: Path) -> None:
    path.write_text(json.dumps(sweep.to_json(), indent=2) + "\n")


def write_best(model_dir: Path, cfg: ModelConfig, candidate: Candidate) -> str:
    """``candidate``'s config.pbtxt in the model's folder, the one it replaces kept as
    config.pbtxt.orig (an existing backup is kept: it is the older); what changed."""
    if candidate.default:
        return "the model's own configuration is the best: config.pbtxt left as it is"
    target = model_dir / "config.pbtxt"
    backup = model_dir / "config.pbtxt.orig"
    base = from_config(cfg)
    if not backup.exists():
        backup.write_bytes(target.read_bytes())
    header = (
        f"# Written by conch analyze ({time.strftime('%Y-%m-%d %H:%M')}): {candidate.label}.\n"
        f"# The configuration it replaced is in {backup.name}.\n"
    )
    target.write_text(header + config_text(apply(cfg, candidate)))
    changes = [
        f"{name} {before} -> {after}"
        for name, before, after in zip(
            (
                "max_batch_size",
                "max_queue_delay_microseconds",
                "preferred_batch_size",
                "instance count",
                "instance_form",
            ),
            base.knobs,
            candidate.knobs,
            strict=True,
        )
        if before != after
    ]
    return f"wrote {target} ({'; '.join(changes)}); the previous one is {backup}"


def read_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        raise AnalyzeError(
            f"{model_dir} has no config.pbtxt (conch analyze alters the model's own)"
        )
    return parse_config(path.read_text(), model=model_dir.name, source=str(path))


def pa_extra(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text)) if text else ()

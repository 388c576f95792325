"""``conch analyze MODEL``: the model analyzer. Sweeps a model's ``max_batch_size``, the
dynamic batcher's queue delay and preferred sizes and its instance count, serving each
configuration privately and driving it with perf_analyzer (``conch.devtools.analyzer``);
prints the table, ranks what meets ``--latency-budget-ms`` (p99), draws throughput against
p99, and with ``--write`` puts the best configuration in the model's folder.

Not a server role: it takes no Settings, it runs the roles it measures as child processes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from conch.core.extras import needs_extra


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="the model to analyze (its folder's name)")
    p.add_argument(
        "--model-repository",
        action="append",
        default=[],
        metavar="DIR",
        help="the repository folder that holds MODEL (repeatable; default: functions)",
    )
    p.add_argument(
        "--latency-budget-ms",
        "--latency-budget",
        dest="latency_budget_ms",
        type=float,
        default=None,
        metavar="MS",
        help="the p99 latency a configuration must meet (Model Analyzer's --latency-budget); "
        "default: none, the highest throughput wins",
    )
    p.add_argument(
        "--max-batch-sizes",
        default="",
        metavar="N,N",
        help="max_batch_size values to sweep (default: the model's own)",
    )
    p.add_argument(
        "--queue-delays-us",
        default="",
        metavar="US,US",
        help="dynamic batching max_queue_delay_microseconds values (default: the model's own)",
    )
    p.add_argument(
        "--preferred-batch-sizes",
        default="",
        metavar="CHOICES",
        help="preferred_batch_size choices: 'none' or sizes joined by '+', comma-separated "
        "(none,8,4+8; default: the model's own)",
    )
    p.add_argument(
        "--instance-counts",
        default="",
        metavar="N,N",
        help="instance counts (each instance_group's count; default: the model's own)",
    )
    p.add_argument(
        "--instance-form",
        choices=("thread", "process"),
        default="",
        help="run the swept configurations' instances as threads or processes (their "
        "config's instance_form parameter; default: the model's own, else the worker's)",
    )
    p.add_argument(
        "--concurrency",
        default="1,8,32",
        metavar="N,N",
        help="perf_analyzer's concurrencies, each configuration at each (default: 1,8,32)",
    )
    p.add_argument(
        "--window-ms",
        type=int,
        default=2000,
        metavar="MS",
        help="perf_analyzer's measurement window (default: 2000)",
    )
    p.add_argument(
        "--stability-percentage",
        type=int,
        default=25,
        metavar="PCT",
        help="perf_analyzer's: windows until three agree within it (default: 25); a point "
        "that never does is measured again taking any three, marked unstable",
    )
    p.add_argument(
        "--perf-analyzer-flags",
        default="",
        metavar="FLAGS",
        help="more perf_analyzer flags, one string (a model with variable dims needs --shape)",
    )
    p.add_argument(
        "--perf-analyzer",
        default="",
        metavar="PATH",
        help="the perf_analyzer binary (default: $PERF_ANALYZER, else bench/perf-analyzer-setup's)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=900.0,
        metavar="S",
        help="the sweep's own time limit: no configuration is started that would end past "
        "it (the default is always measured; default: 900)",
    )
    p.add_argument(
        "--out",
        default="",
        metavar="DIR",
        help="where the results JSON, the PNG, the HTML page and the logs go "
        "(default: .cache/analyze/MODEL-TIME)",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="write the best configuration's config.pbtxt into the model's folder "
        "(the previous one kept as config.pbtxt.orig)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _model_dir(args: argparse.Namespace) -> Path:
    from conch.devtools.analyzer import AnalyzeError

    folders = [Path(f) for f in args.model_repository] or [Path("functions")]
    for folder in folders:
        if (folder / args.model).is_dir():
            return (folder / args.model).resolve()
    raise AnalyzeError(
        f"no folder '{args.model}' in {', '.join(str(f) for f in folders)} (--model-repository)"
    )


def run(args: argparse.Namespace) -> int:
    """The sweep, then its table, picture and files; 2 when the request is refused, 1 when
    nothing could be measured."""
    from conch.devtools import analyzer
    from conch.devtools import perf_analyzer as pa_tool

    def out(text: str) -> None:
        print(text, file=sys.stderr)

    try:
        model_dir = _model_dir(args)
        cfg = analyzer.read_config(model_dir)
        analyzer.check_model(cfg, args.model)
        concurrencies = analyzer.parse_ints(args.concurrency, "--concurrency")
        if not concurrencies or min(concurrencies) < 1:
            raise analyzer.AnalyzeError("--concurrency: one or more values of at least 1")
        grid, skipped = analyzer.build_grid(
            analyzer.from_config(cfg),
            max_batch_sizes=analyzer.parse_ints(args.max_batch_sizes, "--max-batch-sizes"),
            delays_us=analyzer.parse_ints(args.queue_delays_us, "--queue-delays-us"),
            preferred=analyzer.parse_preferred(args.preferred_batch_sizes),
            instance_counts=analyzer.parse_ints(args.instance_counts, "--instance-counts"),
            form=args.instance_form,
        )
        binary = args.perf_analyzer or pa_tool.binary()
    except analyzer.AnalyzeError as exc:
        print(f"conch analyze: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the model's config, or perf_analyzer not found
        print(f"conch analyze: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or f".cache/analyze/{args.model}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    out(
        f"conch analyze {args.model}: {len(grid)} configurations x {len(concurrencies)} "
        f"concurrencies, at most {args.budget_s:g} s; results in {out_dir}"
    )
    pa = analyzer.PaSettings(
        binary,
        window_ms=args.window_ms,
        stability_pct=args.stability_percentage,
        extra=analyzer.pa_extra(args.perf_analyzer_flags),
    )
    sweep = analyzer.run_sweep(
        model_dir,
        grid,
        cfg,
        concurrencies=concurrencies,
        pa=pa,
        out=out_dir,
        budget_s=args.budget_s,
        budget_ms=args.latency_budget_ms,
        skipped=skipped,
        progress=not args.no_progress,
    )
    print(analyzer.table(sweep))
    print()
    print(analyzer.summary(sweep))
    analyzer.save_json(sweep, out_dir / "results.json")
    png = out_dir / f"{args.model}.png"
    if analyzer.picture(sweep, png):
        out(f"picture: {png}")
    else:
        png = None
        out(f"no picture: {needs_extra('the picture', 'matplotlib', 'analyze')}")
    analyzer.html_page(sweep, png, out_dir / "index.html")
    out(f"results: {out_dir / 'results.json'}, {out_dir / 'index.html'}")
    ranked = sweep.ranked
    if args.write:
        if ranked:
            print(analyzer.write_best(model_dir, cfg, ranked[0][0].candidate))
        else:
            print("--write: no configuration met the budget; nothing written")
    return 0 if any(p.measured for r in sweep.results for p in r.points) else 1

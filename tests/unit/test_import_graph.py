"""The rooms' boundaries, read from the real import graph of each process's entry point.

`make lint` checks the same rules as import-linter contracts (pyproject.toml); this test
states the two the architecture exists for in terms of the processes that run: a worker
never loads the HTTP stack, and no module of the gateway imports a model runtime. It reads
the graph twice: statically with grimp (every import, lazy ones inside functions too), and
as Python really loads it, in a fresh interpreter that imports the entry point.
"""

from __future__ import annotations

import json
import subprocess
import sys

import grimp
import pytest

HTTP_STACK = ("flask", "werkzeug", "gunicorn", "gevent", "conch.frontend.http")
RUNTIMES = ("onnxruntime", "torch", "tensorrt")
# What `conch worker`, `conch gateway` and `conch grpc` (either transport) run (conch.cli
# only picks one).
WORKER_ENTRY = "conch.worker.app"
GATEWAY_ENTRIES = (
    "conch.frontend.http.server",
    "conch.frontend.http.app",
    "conch.frontend.grpc.server",
    "conch.frontend.grpc.h2_server",
)
# The frontends' shared composition hands the repository the auto-completer, which may read
# a model file's signature; that one edge is the only way a frontend reaches a backend.
GATEWAY_ROOT_EDGE = ("conch.frontend.composition", "conch.backends.completion")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.fixture
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("conch", "repo_sync", include_external_packages=True)


def _closure(graph: grimp.ImportGraph, entry: str) -> set[str]:
    return {entry, *graph.find_upstream_modules(entry)}


def test_the_worker_never_reaches_the_http_stack(graph: grimp.ImportGraph) -> None:
    reached = sorted(m for m in _closure(graph, WORKER_ENTRY) if _under(m, HTTP_STACK))
    assert reached == [], f"the worker's import graph reaches the HTTP stack: {reached}"


def test_the_gateway_reaches_backends_only_through_its_completer(
    graph: grimp.ImportGraph,
) -> None:
    if GATEWAY_ROOT_EDGE[1] in graph.modules and graph.direct_import_exists(
        importer=GATEWAY_ROOT_EDGE[0], imported=GATEWAY_ROOT_EDGE[1]
    ):
        graph.remove_import(importer=GATEWAY_ROOT_EDGE[0], imported=GATEWAY_ROOT_EDGE[1])
    modules = set().union(*(_closure(graph, e) for e in GATEWAY_ENTRIES))
    reached = sorted(
        m
        for m in modules
        if _under(m, ("conch.backends", "conch.worker", "conch.frontend.bls", *RUNTIMES))
    )
    assert reached == [], f"the gateway's import graph reaches backends or the worker: {reached}"


def test_no_circles_in_the_house(graph: grimp.ImportGraph) -> None:
    """No module of ours reaches back, by any chain, to a module it imports: each room is
    read from the bottom up. grimp reads every import, those under ``TYPE_CHECKING`` and
    inside functions too, so a circle that only a type checker follows counts as well."""
    ours = ("conch", "repo_sync")
    circles = sorted(
        " -> ".join((importer, *back))
        for importer in graph.modules
        if _under(importer, ours)
        for imported in graph.find_modules_directly_imported_by(importer)
        if _under(imported, ours)
        and (back := graph.find_shortest_chain(importer=imported, imported=importer))
    )
    assert circles == [], f"modules that import each other: {circles}"


def test_no_module_imports_the_package_root(graph: grimp.ImportGraph) -> None:
    """``conch/__init__.py`` sits on top of the house (it offers ``conch.Server``); a module
    inside that imports it points an arrow up."""
    importers = sorted(graph.find_modules_that_directly_import("conch"))
    assert importers == [], f"modules that import the package root: {importers}"


def _loaded_by(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout))


def test_a_worker_process_loads_no_http_stack() -> None:
    loaded = sorted(m for m in _loaded_by(WORKER_ENTRY) if _under(m, HTTP_STACK))
    assert loaded == [], f"importing the worker loads the HTTP stack: {loaded}"


def test_a_gateway_process_loads_no_backend_runtime_or_worker() -> None:
    # The completer and the helpers it shares with the backends are there from the start;
    # a backend's own module (and its runtime) only once a model of it needs completing.
    allowed = {"conch.backends", "conch.backends.completion", "conch.backends.autocomplete"}
    allowed |= {"conch.backends.base"}  # the backend interface the completer dispatches on
    loaded = _loaded_by(*GATEWAY_ENTRIES)
    found = sorted(
        m
        for m in loaded
        if _under(m, ("conch.worker", "conch.frontend.bls", *RUNTIMES))
        or (_under(m, ("conch.backends",)) and m not in allowed)
    )
    assert found == [], f"importing the gateway loads worker-side code or runtimes: {found}"


def test_the_grpc_server_on_h2_reaches_no_grpcio(graph: grimp.ImportGraph) -> None:
    """grpcio is a client's dependency and the grpcio transport's extra, never the default
    server's (tests/integration/grpc/test_grpc_without_grpcio.py runs it so)."""
    reached = sorted(
        m
        for m in _closure(graph, "conch.frontend.grpc.h2_server")
        if _under(m, ("grpc", "grpc_health", "conch.frontend.grpc.server"))
    )
    assert reached == [], f"the h2 server's import graph reaches grpcio: {reached}"


def test_importing_conch_loads_no_role_and_the_embedded_server_no_fleet_code() -> None:
    """``import conch`` (which every process does) loads no role: ``conch.Server`` is
    imported on first use. An embedded server's engine loads neither a frontend nor the
    worker's Redis-bound code, nor a server stack."""
    bare = sorted(m for m in _loaded_by("conch") if m.startswith("conch."))
    assert bare == ["conch.api", "conch.version"], f"import conch loads: {bare}"
    loaded = _loaded_by("conch.server", "conch.embedded.engine")
    found = sorted(
        m for m in loaded if _under(m, ("conch.frontend", "conch.worker", "celery", *HTTP_STACK))
    )
    assert found == [], f"the embedded server loads fleet code: {found}"

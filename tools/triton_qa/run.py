"""``make triton-qa``: chosen cases of Triton's own qa files, run unchanged against conch.

For each group of ``cases.py`` the runner builds the group's model repository, starts a
private redis-server and ``conch serve`` on it, runs each case as its test.sh does
(``python <file> <Class.case>`` in the file's folder, ``qa/common`` on ``PYTHONPATH``) and
records passed, failed or skipped from the exit status; then it stops both. It ends with a
table of every case and a summary line, and exits 1 when a case failed.

The qa files name Triton's ports (``localhost:8000``, ``8001``, ``8002``), so the run
takes place in a network namespace of its own (``unshare --net``, as root or with a user
namespace): there conch can have those ports while the host's own are in use, and nothing
of the run is reachable from outside. ``--host-network`` runs on the host's loopback
instead, when its ports 8000 to 8002 are free.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from conch.devtools.processes import conch, run_bounded, spawn, wait_until
from conch.devtools.redis_server import start_private
from tools.triton_qa.cases import GROUPS, Case, Group
from tools.triton_qa.repository import Build, python_path
from tools.triton_qa.source import SourceError, resolve

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PATH = Path(__file__).with_name("client_path")  # modules the cases import (stand-ins)
HTTP, GRPC, METRICS = 8000, 8001, 8002  # Triton's ports, which the qa files name
IN_PRIVATE_NETWORK = "CONCH_TRITON_QA_NETNS"  # set in the namespace the run re-enters
READY_S = 240  # for a server to load a repository (the ensembles' hundred models, say)
STOP_S = 20
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b.*")


@dataclass(frozen=True)
class Result:
    case: Case
    status: str  # passed, failed or skipped
    note: str = ""  # why it failed, in one line
    log: Path | None = None


# -- what the run reports (pure) ----------------------------------------------------------


def select(groups: Iterable[Group], patterns: Sequence[str]) -> list[Group]:
    """The groups, each with only the cases whose label or group name holds one of
    ``patterns`` (all of them when none is given); groups left empty are dropped."""
    chosen = []
    for group in groups:
        cases = tuple(
            c
            for c in group.cases
            if not patterns or any(p in c.label or p in group.name for p in patterns)
        )
        if cases:
            chosen.append(dataclasses.replace(group, cases=cases))
    return chosen


def reason(output: str) -> str:
    """One line saying why a case failed: the last error line its output shows, else
    its first line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    found = errors[-1] if errors else (lines[0] if lines else "no output")
    return found if len(found) <= 160 else found[:157] + "..."


def outcome(code: int | None, output: str) -> tuple[str, str]:
    """A case's status and note from its exit status (None: it ran out of time) and output."""
    if code is None:
        return "failed", "timed out"
    if code == 0:
        skipped = re.search(r"^OK \(skipped=\d+\)", output, re.MULTILINE)
        return ("skipped", reason(output.split("OK (skipped")[0])) if skipped else ("passed", "")
    return "failed", reason(output)


def table(results: Sequence[Result]) -> str:
    """``file :: case  status  note``, one line a case, in the order they ran."""
    width = max((len(r.case.label) for r in results), default=0)
    return "\n".join(f"{r.case.label:<{width}}  {r.status:<7}  {r.note}".rstrip() for r in results)


def summary(results: Sequence[Result]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
    line = f"{counts['passed']} passed, {counts['failed']} failed"
    return line + (f", {counts['skipped']} skipped" if counts["skipped"] else "")


# -- the network the run happens in -------------------------------------------------------


def _unshare() -> list[str]:
    """unshare's argv for a new network namespace (a user namespace too when not root)."""
    return ["unshare", "--net", *([] if os.geteuid() == 0 else ["--map-root-user"])]


def private_network_argv(argv: Sequence[str]) -> list[str]:
    """This run again, in a network namespace of its own."""
    return [*_unshare(), "--", sys.executable, "-m", "tools.triton_qa", *argv]


def private_network_refusal() -> str | None:
    """Why a network namespace cannot be made here, or None when it can."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "network namespaces need Linux and util-linux's unshare"
    probe = subprocess.run([*_unshare(), "true"], capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        return None
    return probe.stderr.strip() or f"unshare exited with {probe.returncode}"


def loopback_up() -> None:
    """Bring up ``lo``, which a new network namespace starts with down (SIOCSIFFLAGS)."""
    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        _, flags = struct.unpack("16sh", fcntl.ioctl(sock, get_flags, request))
        fcntl.ioctl(sock, set_flags, struct.pack("16sh", b"lo", flags | up))


def taken(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- a group's server ---------------------------------------------------------------------


def _ready() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/v2/health/ready", timeout=2) as r:
            return r.status == 200 and taken(GRPC) and taken(METRICS)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def serving(repo: Path, flags: Sequence[str], log_path: Path) -> Iterator[str | None]:
    """``conch serve`` on Triton's ports over a private Redis, both stopped on the way out.
    Yields None once the server is ready, else why it is not."""
    redis = start_private()
    argv = conch(
        "serve",
        *("--model-repository", str(repo), "--redis-url", redis.url),
        *("--http-address", "127.0.0.1", "--http-port", str(HTTP)),
        *("--grpc-address", "127.0.0.1", "--grpc-port", str(GRPC)),
        *("--metrics-address", "127.0.0.1", "--metrics-port", str(METRICS)),
        *flags,
    )
    with open(log_path, "wb") as log:
        proc = spawn(argv, log)

        def watch() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"conch serve exited with {proc.returncode}")

        try:
            try:
                ready = wait_until(_ready, READY_S, watch=watch, every=0.5)
                why = None if ready else f"not ready within {READY_S} s"
            except RuntimeError as exited:
                why = str(exited)
            yield why
        finally:
            _stop(proc)
            redis.stop()
            wait_until(lambda: not any(map(taken, (HTTP, GRPC, METRICS))), STOP_S)


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)


# -- running the cases --------------------------------------------------------------------


def run_case(
    case: Case, group: Group, build: Build, repo: Path, logs: Path, timeout_s: float
) -> Result:
    """``python <file> <argv>`` in the file's folder, as its test.sh runs it."""
    argv = [sys.executable, PurePosixPath(case.file).name]
    argv += [a.format(repository=repo) for a in case.argv]
    env = {**os.environ, **group.env, "PYTHONPATH": python_path(build.qa("common"), CLIENT_PATH)}
    log = logs / (case.case.replace("/", ".") + ".log")
    code, output = run_bounded(
        argv, timeout_s=timeout_s, log_path=log, env=env, cwd=build.qa(case.folder)
    )
    status, note = outcome(code, output)
    return Result(case, status, note, log)


def run_groups(groups: Sequence[Group], build: Build, work: Path, timeout_s: float) -> list[Result]:
    results: list[Result] = []
    with tqdm(total=sum(len(g.cases) for g in groups), unit="case", dynamic_ncols=True) as bar:

        def record(result: Result) -> None:
            results.append(result)
            bar.update()
            if result.status == "failed":
                tqdm.write(f"failed  {result.case.label}  {result.note}", file=sys.stderr)

        for group in groups:
            bar.set_description(group.name)
            logs = work / "logs" / group.name
            logs.mkdir(parents=True, exist_ok=True)
            repo = work / "repos" / group.name
            shutil.rmtree(repo, ignore_errors=True)
            repo.mkdir(parents=True)
            bar.set_postfix_str("building the repository")
            try:
                group.build(build, repo)
            except Exception as error:  # any step of a recipe: the group's cases fail
                for case in group.cases:
                    record(Result(case, "failed", f"repository not built: {error}"))
                continue
            bar.set_postfix_str("starting conch serve")
            if group.server_log:
                link = build.qa(group.cases[0].folder) / group.server_log
                link.unlink(missing_ok=True)
                link.symlink_to(logs / "serve.log")
            with serving(repo, group.flags, logs / "serve.log") as not_ready:
                for case in group.cases:
                    bar.set_postfix_str(case.case)
                    if not_ready:
                        record(Result(case, "failed", f"server: {not_ready}", logs / "serve.log"))
                    else:
                        record(run_case(case, group, build, repo, logs, timeout_s))
    return results


def _commit(path: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make triton-qa", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--triton-repo",
        default=os.environ.get("TRITON_SERVER_REPO") or ".cache/triton-server",
        help="a checkout of triton-inference-server/server: a work tree or a git directory "
        "(default: $TRITON_SERVER_REPO, else .cache/triton-server)",
    )
    parser.add_argument(
        "--ref",
        default=os.environ.get("TRITON_SERVER_REF") or "HEAD",
        help="the commit read from a git directory (default: $TRITON_SERVER_REF, else HEAD)",
    )
    parser.add_argument(
        "-k",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the cases whose 'file :: case' or group name holds TEXT (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list the chosen cases and exit")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="scratch folder (default: a new one in the temporary folder; a folder given "
        "again keeps its generated models)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder after a pass")
    parser.add_argument("--case-timeout", type=float, default=300, metavar="S")
    parser.add_argument(
        "--host-network",
        action="store_true",
        help="run on the host's loopback, not in a network namespace (ports 8000-8002 must be free)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    groups = select(GROUPS, args.k)
    if args.list:
        print("\n".join(c.label for g in groups for c in g.cases))
        return 0
    try:
        source = resolve(args.triton_repo, args.ref)
    except SourceError as error:
        print(f"make triton-qa: {error}", file=sys.stderr)
        return 2
    if not args.host_network and not os.environ.get(IN_PRIVATE_NETWORK):
        refused = private_network_refusal()
        if refused:
            print(
                f"make triton-qa: cannot make a network namespace ({refused}); "
                'with ports 8000-8002 free, run make triton-qa TRITON_QA_ARGS="--host-network"',
                file=sys.stderr,
            )
            return 2
        env = {**os.environ, IN_PRIVATE_NETWORK: "1", "PYTHONPATH": python_path(ROOT)}
        os.execvpe("unshare", private_network_argv(argv), env)
    if os.environ.get(IN_PRIVATE_NETWORK):
        loopback_up()
    busy = [p for p in (HTTP, GRPC, METRICS) if taken(p)]
    if busy:
        print(f"make triton-qa: ports {busy} are in use on this network", file=sys.stderr)
        return 2

    work = args.workdir or Path(tempfile.mkdtemp(prefix="conch-triton-qa-"))
    src = work / "src"
    source.extract(set().union(*(g.needs for g in groups)), src)
    print(
        f"Triton's qa at {source.commit[:12]} ({source.path}), conch at {_commit(ROOT)}; "
        f"scratch folder {work}",
        file=sys.stderr,
    )
    results = run_groups(groups, Build(src, work / "data"), work, args.case_timeout)
    print(table(results))
    print(summary(results))
    failed = any(r.status == "failed" for r in results)
    if failed or args.keep or args.workdir:
        print(f"logs and repositories: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0

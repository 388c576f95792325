"""bench/http_cores.py's turns and table, and the greenlet bridge its prototypes run
conch's blocking infer code on (bench/http_core_app.py)."""

from __future__ import annotations

import asyncio

from unit.bench._bench import bench_module

cores = bench_module("http_cores")
app = bench_module("http_core_app")


def test_each_round_takes_turns_there_and_back() -> None:
    assert cores.order(["a", "b", "c"], 2) == [["a", "b", "c", "c", "b", "a"]] * 2


def test_the_table_has_a_row_per_server_and_concurrency_full_path_first() -> None:
    points = [
        cores.Point(core, c, 0, 1000, 0.5, cpu, 0.2, 3.0)
        for core in ("gevent", "granian", "gevent canned")
        for c in (64, 1)
        for cpu in (0.2, 0.4)
    ]
    rows = cores.summary(points).splitlines()[2:]
    assert [r.split(" | ")[:2] for r in rows] == [
        ["| gevent", "1"],
        ["| granian", "1"],
        ["| gevent", "64"],
        ["| granian", "64"],
        ["| gevent canned", "1"],
        ["| gevent canned", "64"],
    ]
    assert "| 200, 400 | 300 | 20 % | 500 |" in rows[0]  # turns, median, kernel, wall


def test_the_bridge_awaits_on_the_loop_what_the_greenlet_waits_for() -> None:
    async def later(value: int) -> int:
        await asyncio.sleep(0)
        return value * 2

    async def failing() -> None:
        raise ValueError("from the loop")

    def blocking_code(x: int) -> int:
        doubled = app.await_only(later(x))  # suspends this greenlet, not the loop
        try:
            app.await_only(failing())
        except ValueError as exc:
            return doubled + len(str(exc))
        return -1

    got = asyncio.run(app.in_greenlet(blocking_code, 5))
    assert got == 10 + len("from the loop")

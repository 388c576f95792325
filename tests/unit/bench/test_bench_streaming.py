"""bench/streaming.py's own parts: the repository it serves, its requests, the order of its
turns, how it pools a point's rounds and what its tables say."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit.bench._bench import bench_module


@pytest.fixture(scope="module")
def st():
    return bench_module("streaming")


def test_the_repository_holds_the_vendored_example_unchanged(st, tmp_path: Path) -> None:
    repo = st.build_repository(tmp_path / "repo")
    model = repo / st.MODEL / "1" / "model.py"
    config = repo / st.MODEL / "config.pbtxt"
    assert model.read_bytes() == (st.EXAMPLE / "decoupled" / "repeat_model.py").read_bytes()
    assert config.read_bytes() == (st.EXAMPLE / "decoupled" / "repeat_config.pbtxt").read_bytes()
    assert f'name: "{st.MODEL}"' in config.read_text()


def test_a_request_asks_for_its_responses_at_once(st) -> None:
    arrays = st.request_arrays(5)
    assert arrays["IN"].tolist() == [0, 1, 2, 3, 4] and str(arrays["IN"].dtype) == "int32"
    assert arrays["DELAY"].tolist() == [0] * 5 and str(arrays["DELAY"].dtype) == "uint32"
    assert arrays["WAIT"].tolist() == [0] and str(arrays["WAIT"].dtype) == "uint32"


def test_turns_alternate(st) -> None:
    assert st.order(3) == ["triton", "conch", "conch", "triton", "triton", "conch"]


def _window(st, server: str, requests: list, seconds: float, cpu: dict[str, float]):
    return st.Window(server, 2, requests, seconds, cpu)


def test_a_point_pools_its_rounds_and_drops_failed_requests(st) -> None:
    request = st.Request
    first = _window(
        st,
        "conch",
        [request(0.0, [0.002, 0.003, 0.004]), request(1.0, [1.004, 1.005, 1.007])],
        2.0,
        {"worker": 0.0006, st.CLIENT: 0.0003},
    )
    second = _window(
        st,
        "conch",
        [request(5.0, [5.003, 5.004, 5.005]), request(6.0, [6.5], error="1 responses, not 3")],
        1.0,
        {"worker": 0.0003, st.CLIENT: 0.0},
    )
    p = st.pool([first, second])
    assert (p.requests, p.responses, p.errors) == (4, 9, 1)
    assert p.responses_per_s == pytest.approx(3.0)  # 9 responses in 3 s
    assert p.first_p50_ms == pytest.approx(3.0)  # of 2, 4 and 3 ms
    assert p.gap_p50_ms == pytest.approx(1.0)  # gaps 1 1 1 2 1 1 ms
    assert 1.0 < p.gap_p99_ms <= 2.0
    assert p.cpu_us == pytest.approx({"worker": 100.0, st.CLIENT: 100.0 / 3})
    assert p.server_cpu_us == pytest.approx(100.0)  # the client is not the server
    failed = st.pool([_window(st, "conch", [request(0.0, error="no final")], 1.0, {})])
    assert failed.responses_per_s is None and failed.errors == 1


def test_the_report_says_whether_conch_meets_the_goals(st) -> None:
    results = st.Results()
    request = st.Request

    def add(server: str, streams: int, sent_to_first_s: float, responses: int) -> None:
        arrivals = [sent_to_first_s + i * 0.001 for i in range(responses)]
        w = st.Window(server, streams, [request(0.0, arrivals)], 1.0, {"server": 0.001})
        results.windows.append(w)

    add("triton", 1, 0.002, 100)
    add("conch", 1, 0.0025, 90)  # 0.9x, +0.5 ms: both met
    add("triton", 4, 0.002, 100)
    add("conch", 4, 0.004, 70)  # 0.7x, +2 ms: both missed
    args = st.parse_args(["--quick", "--streams", "1,4,8"])
    text = st.report(results, args)
    assert "| 1 | conch | 90 | 2.50 | 1.000 | 11 | n/a | 0.90 (met) | +0.50 ms (met) |" in text
    assert (
        "| 4 | conch | 70 | 4.00 | 1.000 | 14 | n/a | 0.70 (missed) | +2.00 ms (missed) |" in text
    )
    assert "| 8 | Triton | n/a | n/a | n/a | n/a | n/a |  |  |" in text
    assert st.goals(None, results.point("triton", 1)) == ("n/a", "n/a")


def test_quick_runs_shorter(st) -> None:
    quick, full = st.parse_args(["--quick"]), st.parse_args([])
    assert (quick.window_s, quick.rounds) < (full.window_s, full.rounds)
    assert full.streams == [1, 4] and full.responses == 1000

"""``desktop-sandbox bench`` (controller/bench.py): percentiles, interleaved sampling, the report, and one
short real run on a private Xvfb (the Docker section skipped)."""

from __future__ import annotations

import json

from controller import bench
from tests.require import require_commands


def test_p95_is_the_nearest_rank_and_p50_the_median():
    for n, p95 in ((1, 1), (10, 10), (19, 19), (20, 19), (30, 29), (50, 48), (100, 95)):
        got = bench.percentiles([float(v) for v in range(n, 0, -1)])
        assert got["p95"] == p95, (n, got)
        assert got["n"] == n
    assert bench.percentiles([1.0, 2.0, 3.0, 10.0])["p50"] == 2.5


def test_cases_are_sampled_round_robin():
    calls: list[tuple[str, int]] = []

    def case(name: str):
        return lambda i: calls.append((name, i))

    cases = {"a": (case("a"), 3), "b": (case("b"), 2)}
    samples = bench.interleave(cases, warmup=1)
    assert calls == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 2}


def test_a_missing_image_skips_the_docker_section_with_the_reason():
    result = bench.run_docker("desktop-sandbox:no-such-tag-for-bench-tests", iterations=1)
    assert set(result) == {"skipped"}
    assert "no-such-tag-for-bench-tests" in result["skipped"] or "no Docker engine" in result["skipped"]


def test_report_renders_every_section_and_check():
    row = {"agent": {"p50": 2.0, "p95": 3.0, "n": 5}}
    report = {"screen": "1280x800x24", "iterations": 5, "settle_rule": bench.SETTLE_RULE,
              "results": {"click+screenshot png": {**row, "baseline": {"p50": 40.0, "p95": 50.0, "n": 3}, "ratio": 20.0}},
              "docker": {"image": "img", "rows": {"driver click+screenshot": {**row, "x_floor": 2.5}},
                         "idle_wait_settled": [True]},
              "derived": {"docker settle cost per step (ms)": 101.5},
              "checks": {"one": True, "two": False}}
    text = bench.render(report)
    for needle in ("settle rule: wait settles", "click+screenshot png", "20.0x", "docker sandbox img",
                   "2.5x", "docker settle cost per step (ms): 101.50", "PASS  one", "FAIL  two"):
        assert needle in text, needle
    report["docker"] = {"skipped": "no Docker engine (refused)"}
    assert "docker sandbox: skipped (no Docker engine (refused))" in bench.render(report)


def test_a_short_run_measures_every_loopback_case(tmp_path, capsys):
    require_commands("X", "Xvfb", "xterm", install="apt-get install xvfb xterm")
    out = tmp_path / "bench.json"
    report = bench.main(["--iterations", "2", "--no-baseline", "--no-docker", "--json", str(out)])
    assert set(report["results"]) == {"floor: grab+encode png, in process", "click+screenshot png",
                                      "click+screenshot jpeg", "screenshot png", "wait (idle screen)",
                                      "settled step (driver)", "type 100 ascii", "type 100 unicode"}
    assert all(row["agent"]["n"] == 2 for row in report["results"].values())
    assert report["docker"] == {"skipped": "--no-docker"}
    assert "loopback settle cost per step (ms)" in report["derived"]
    assert any("settled step" in check for check in report["checks"])
    assert json.loads(out.read_text())["checks"] == report["checks"]
    assert "docker sandbox: skipped (--no-docker)" in capsys.readouterr().out

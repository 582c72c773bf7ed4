"""``desktop-sandbox bench`` (controller/bench.py): percentiles, interleaved sampling, the report, and one
short real run on a private Xvfb (the Docker and console sections skipped); the console section
(controller/bench_console.py) in one short real run of its own, in Debian's chromium."""

from __future__ import annotations

import json

import pytest

from controller import bench, bench_console
from tests.require import require_browser, require_commands


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
              "console": CONSOLE,
              "derived": {"docker settle cost per step (ms)": 101.5},
              "checks": {"one": True, "two": False}}
    text = bench.render(report)
    for needle in ("settle rule: wait settles", "click+screenshot png", "20.0x", "docker sandbox img",
                   "2.5x", "docker settle cost per step (ms): 101.50", "PASS  one", "FAIL  two",
                   "web console: page on 127.0.0.1", "action-to-pixels (page <img>)", "120.00", "8.0x",
                   "live view at 5 fps: controller CPU 1.50% of one core", "2.1 ms CPU per frame",
                   "browser received 4.90 fps"):
        assert needle in text, needle
    report["docker"] = {"skipped": "no Docker engine (refused)"}
    report["console"] = {"skipped": "/usr/bin/chromium not installed"}
    text = bench.render(report)
    assert "docker sandbox: skipped (no Docker engine (refused))" in text
    assert "web console: skipped (/usr/bin/chromium not installed)" in text


CONSOLE = {"screen": "1280x800x24",
           "latency": {"console": {"p50": 120.0, "p95": 210.0, "n": 5}, "floor": {"p50": 15.0, "p95": 20.0, "n": 5},
                       "input_post": {"p50": 9.0, "p95": 12.0, "n": 5}, "x_floor": 8.0},
           "cpu": {"fps": 5.0, "window_s": 4.0, "rounds": 3, "idle_cpu_pct": 0.3, "viewer_cpu_pct": 1.8,
                   "live_view_cpu_pct": 1.5, "cpu_ms_per_frame": 2.1, "browser_fps": 4.9, "served_fps": 5.0,
                   "idle_served": 0, "agent_cpu_pct": 3.0, "frame_kib": 16.2,
                   "tabs": {"count": 5, "viewer_cpu_pct": 2.4, "live_view_cpu_pct": 2.1, "cpu_ms_per_frame": 2.9,
                            "browser_fps": 4.8, "served_fps": 5.2, "agent_cpu_pct": 3.2}}}


def test_console_checks_judge_the_p50_and_the_frame_rate():
    def names(section):
        return {name.split(" (")[0].split(":")[0]: ok for name, ok in bench_console.checks(section).items()}

    assert names(CONSOLE) == {"console action-to-pixels p50 < 150 ms": True, "console live view at 5 fps": True}
    slow = json.loads(json.dumps(CONSOLE))
    slow["latency"]["console"]["p50"] = 150.0
    slow["cpu"]["browser_fps"] = 4.4
    assert names(slow) == {"console action-to-pixels p50 < 150 ms": False, "console live view at 5 fps": False}
    many = json.loads(json.dumps(CONSOLE))
    many["cpu"]["tabs"]["served_fps"] = 5.0 * 5  # a grab loop per tab
    assert names(many)["console live view at 5 fps"] is False
    assert any("controller CPU 1.5% of one core" in name for name in bench_console.checks(CONSOLE))
    assert bench_console.checks({"skipped": "why"}) == {}


def test_a_short_run_measures_every_loopback_case(tmp_path, capsys):
    require_commands("X", "Xvfb", "xterm", install="apt-get install xvfb xterm")
    out = tmp_path / "bench.json"
    report = bench.main(["--iterations", "2", "--no-baseline", "--no-docker", "--no-console", "--json", str(out)])
    assert set(report["results"]) == {"floor: grab+encode png, in process", "click+screenshot png",
                                      "click+screenshot jpeg", "screenshot png", "wait (idle screen)",
                                      "settled step (driver)", "type 100 ascii", "type 100 unicode"}
    assert all(row["agent"]["n"] == 2 for row in report["results"].values())
    assert report["docker"] == {"skipped": "--no-docker"}
    assert report["console"] == {"skipped": "--no-console"}
    assert "loopback settle cost per step (ms)" in report["derived"]
    assert any("settled step" in check for check in report["checks"])
    assert json.loads(out.read_text())["checks"] == report["checks"]
    assert "docker sandbox: skipped (--no-docker)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_short_console_run_measures_latency_and_cpu():
    require_commands("X", "Xvfb", install="apt-get install xvfb")
    require_browser()
    section = bench_console.run_console(iterations=3, rounds=1, window_s=1.0)
    assert set(section) == {"screen", "latency", "cpu"}, section
    latency = section["latency"]
    for name in ("console", "floor", "input_post"):
        assert latency[name]["n"] == 3, (name, latency)
        assert 0 < latency[name]["p50"] <= latency[name]["p95"] < bench_console.SAMPLE_TIMEOUT_S * 1000, (name, latency)
    # the console shows a change only in a frame taken after it: never sooner than the input's round trip
    assert latency["console"]["p50"] > latency["input_post"]["p50"], latency
    assert latency["x_floor"] > 0
    cpu = section["cpu"]
    assert cpu["rounds"] == 1 and cpu["fps"] == bench_console.FPS
    assert cpu["idle_served"] == 0, "a stopped viewer's stream kept serving frames"
    assert cpu["served_fps"] > 0 and cpu["browser_fps"] > 0, cpu
    assert cpu["viewer_cpu_pct"] > 0 and cpu["idle_cpu_pct"] >= 0 and cpu["agent_cpu_pct"] >= 0, cpu
    assert cpu["cpu_ms_per_frame"] is not None and cpu["frame_kib"] > 0, cpu
    tabs = cpu["tabs"]  # five tabs shown: one grab loop serves them all
    assert tabs["count"] == bench_console.TABS and tabs["browser_fps"] > 0, tabs
    assert tabs["served_fps"] <= bench_console.MAX_SHARED_RATIO * cpu["served_fps"] + 1, cpu
    lines = bench_console.render_lines(section)
    assert lines[0].startswith("web console:") and any(line.startswith("live view at 5 fps") for line in lines)
    assert len(bench_console.checks(section)) == 2

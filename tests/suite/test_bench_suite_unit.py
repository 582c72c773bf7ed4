"""The scaling benchmark's arithmetic (controller.bench_suite) on made-up stats: memory as ``docker stats``
shows it, CPU from two samples, per-sweep totals and the derived model. The benchmark itself is run by
hand (``desktop-sandbox bench --suite``), never as a timed test."""

from __future__ import annotations

from controller import bench_suite as bs


def test_memory_subtracts_inactive_file_on_either_cgroup_version():
    v2 = {"memory_stats": {"usage": 300 * 1024**2, "stats": {"inactive_file": 44 * 1024**2}}}
    v1 = {"memory_stats": {"usage": 300 * 1024**2, "stats": {"total_inactive_file": 100 * 1024**2}}}
    assert bs.memory_mib(v2) == 256.0 and bs.memory_mib(v1) == 200.0
    assert bs.memory_mib({"memory_stats": {}}) is None
    assert bs.cpu_total_ns({"cpu_stats": {"cpu_usage": {"total_usage": 7}}}) == 7


def test_cpu_cores_from_two_samples():
    assert bs.cpu_cores((10.0, 0), (12.0, 3_000_000_000)) == 1.5
    assert bs.cpu_cores((10.0, 5), (10.0, 9)) is None and bs.cpu_cores((10.0, 9), (11.0, 5)) is None


def test_summary_and_sweep_totals():
    assert bs.summary([3.0, None, 1.0, 2.0]) == {"p50": 2.0, "max": 3.0, "n": 3}
    assert bs.summary([]) == {"p50": None, "max": None, "n": 0}
    samples = [bs.Sample(t=0, sweep=1, owner="o", role="desktop", sandbox="s", mem_mib=500.0, cpu=0.5),
               bs.Sample(t=0, sweep=1, owner="o", role="gateway", sandbox="s", mem_mib=100.0, cpu=0.1),
               bs.Sample(t=2, sweep=2, owner="o", role="desktop", sandbox="s", mem_mib=520.0, cpu=None)]
    assert bs._per_moment_total(samples) == [600.0, 520.0]
    assert bs._per_moment_total(samples, "cpu") == [0.6, 0.0]


def _level(n: int, passed: int, **extra) -> dict:
    level = {"n": n, "passed": passed, "runs": n, "controller_rss_mib": {"max": 110.0},
             "controller_cpu": {"p50": 0.1}, "busy": {"sandbox_mem_mib": {"max": 650.0}, "sandbox_cpu": {"p50": 0.9}}}
    level.update(extra)
    return level


def test_derive_the_model():
    report = {"host": {"cores": 2, "mem_available_mib": 7600},
              "idle": {"sandbox_mem_mib": {"p50": 640.0}},
              "levels": [_level(1, 1), _level(2, 2), _level(4, 4), _level(8, 6)]}
    model = bs.derive(report)
    assert model["mem_per_sandbox_idle_mib"] == 640.0 and model["mem_per_sandbox_busy_peak_mib"] == 650.0
    assert model["mem_per_run_mib"] == 760.0 and model["n_by_memory"] == 10
    assert model["cpu_per_busy_run"] == 1.0 and model["n_by_cpu"] == 2.0
    assert model["largest_passing_n"] == 4 and model["first_failing_n"] == 8
    assert bs.derive({"host": {}, "levels": [_level(1, 0)]})["largest_passing_n"] is None

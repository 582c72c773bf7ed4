"""Benchmark: many sandboxes on one host -- what one costs idle and busy, and how runs scale with N at once.

``desktop-sandbox bench --suite [--levels 1,2,4,8] [--task tasks/pickup.toml] [--image TAG]
[--idle-samples N] [--runs-dir DIR] [--json FILE]`` (or ``python -m controller.bench_suite ...``).

Measured, on the Docker backend, through the Docker SDK's container stats (``one_shot``: memory as
``docker stats`` shows it -- usage less the inactive page cache, tmpfs included --, CPU from the
difference of two samples' ``cpu_usage.total_usage`` over the time between them, in cores):

- **idle sandbox**: one sandbox laid out as the task (its apps launched, its ``[[ready]]`` files there),
  then ``--idle-samples`` samples ``SAMPLE_S`` apart: memory and CPU of the desktop and the gateway;
- **each level N** of ``--levels``: the task ``N`` times, ``N`` at once, through :mod:`controller.suite`
  (each run is ``run-task`` in a process of its own, as ``run-suite`` runs it). Every ``SAMPLE_S`` the
  sampler reads the stats of every container the runs' processes own (``desktop-sandbox.owner``) and the
  resident memory and CPU time of those processes (``/proc``). Per level: how many runs passed, sandbox
  start time and ``run-task`` wall time (median and largest, seconds, from the records), the peak of the
  memory of all the level's containers together, the host's CPU in use, and -- at N = 1 -- a **busy
  sandbox**: the samples taken while the model loop ran (from the record's first ``model_response`` to its
  first ``check``).

Derived (``model``): memory per sandbox (idle; busy peak; with the controller process), CPU per busy run,
the N at which memory or CPU would run out on this host, and the largest N tried at which every run
passed. Noted beside them: the host's cores and memory, its load average before and after, and the other
sandboxes running on the engine meanwhile (other people's work shares the machine).

Not a test: figures depend on the host and what else runs on it. Exit status (through ``bench``): 0 when
the task passed at N = 1 (the baseline every other figure leans on), else 1.

Over 400 lines: the sampler, the measurements and the model derived from them share one report.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from controller.sandbox import LABEL_OWNER, LABEL_ROLE, LABEL_SANDBOX
from controller.text import clean

SAMPLE_S = 2.0
"""Seconds between two samples of the containers' stats (a sampling period, not a wait for a condition)."""
DEFAULT_LEVELS = (1, 2, 4, 8)
DEFAULT_TASK = Path("tasks/pickup.toml")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def memory_mib(stats: dict[str, Any]) -> float | None:
    """A container's memory in MiB as ``docker stats`` shows it: ``usage`` less the inactive file cache
    (``inactive_file`` on cgroup v2, ``total_inactive_file`` on v1); None when the stats have none."""
    mem = stats.get("memory_stats") or {}
    usage = mem.get("usage")
    if usage is None:
        return None
    inner = mem.get("stats") or {}
    inactive = inner.get("inactive_file", inner.get("total_inactive_file", 0)) or 0
    return round(max(usage - inactive, 0) / 1024**2, 1)


def cpu_total_ns(stats: dict[str, Any]) -> int | None:
    """A container's CPU time so far (ns, ``cpu_stats.cpu_usage.total_usage``), or None."""
    return ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")


def cpu_cores(before: tuple[float, int], after: tuple[float, int]) -> float | None:
    """Cores in use between two ``(monotonic seconds, CPU ns)`` samples (1.0 = one core busy); None when
    they are not in order."""
    dt = after[0] - before[0]
    if dt <= 0 or after[1] < before[1]:
        return None
    return round((after[1] - before[1]) / 1e9 / dt, 3)


def summary(values: Iterable[float | None]) -> dict[str, float | None]:
    """``{"p50", "max", "n"}`` of the values present (None when there are none)."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return {"p50": None, "max": None, "n": 0}
    return {"p50": round(statistics.median(present), 3), "max": round(present[-1], 3), "n": len(present)}


@dataclass
class Sample:
    """One container's sample: ``t`` (UTC epoch seconds), ``sweep`` (the sampler's round: samples of one
    sweep are taken together), ``owner`` (label value), ``role`` (desktop | gateway), ``sandbox`` id,
    ``mem_mib``, ``cpu`` (cores since the previous sample of it; None first)."""

    t: float
    sweep: int
    owner: str
    role: str
    sandbox: str
    mem_mib: float | None
    cpu: float | None


@dataclass
class ProcSample:
    """One controller process's sample: ``t`` (epoch s), ``pid``, ``rss_mib``, ``cpu`` (cores since its
    previous sample; None first)."""

    t: float
    pid: int
    rss_mib: float | None
    cpu: float | None


class Sampler:
    """Samples, every :data:`SAMPLE_S` in a thread of its own, the stats of every container whose
    ``desktop-sandbox.owner`` is in ``owners()`` (a callable: the set may grow as runs start) and the
    memory and CPU of the processes ``pids()`` names. ``host_cpu``: the host's busy cores per sample."""

    def __init__(self, client: Any, owners: Callable[[], set[str]], pids: Callable[[], set[int]]) -> None:
        self.client = client
        self.owners = owners
        self.pids = pids
        self.samples: list[Sample] = []
        self.procs: list[ProcSample] = []
        self.host_cpu: list[float] = []
        self._last: dict[str, tuple[float, int]] = {}
        self._last_proc: dict[int, tuple[float, int]] = {}
        self._sweep = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        host_before = _host_cpu()
        while not self._stop.is_set():
            started = time.monotonic()
            self._sweep += 1
            with contextlib.suppress(Exception):  # a container removed between list and stats
                self._sample_containers()
            self._sample_procs()
            host_after = _host_cpu()
            if host_before and host_after and host_after[0] > host_before[0]:
                busy = (host_after[1] - host_before[1]) / (host_after[0] - host_before[0])
                self.host_cpu.append(round(busy, 3))
            host_before = host_after
            self._stop.wait(max(0.0, SAMPLE_S - (time.monotonic() - started)))  # the sampling period

    def _sample_containers(self) -> None:
        owners = self.owners()
        if not owners:
            return
        for c in self.client.containers.list(ignore_removed=True, filters={"label": LABEL_SANDBOX}):
            labels = c.labels
            if labels.get(LABEL_OWNER) not in owners:
                continue
            try:
                stats = self.client.api.stats(c.id, stream=False, one_shot=True)
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
            now = time.monotonic()
            total = cpu_total_ns(stats)
            cpu = None
            if total is not None:
                if c.id in self._last:
                    cpu = cpu_cores(self._last[c.id], (now, total))
                self._last[c.id] = (now, total)
            self.samples.append(Sample(t=time.time(), sweep=self._sweep, owner=labels.get(LABEL_OWNER, ""),
                                       role=labels.get(LABEL_ROLE, ""), sandbox=labels.get(LABEL_SANDBOX, ""),
                                       mem_mib=memory_mib(stats), cpu=cpu))

    def _sample_procs(self) -> None:
        for pid in self.pids():
            rss, ticks = _proc_rss_ticks(pid)
            if rss is None:
                continue
            now = time.monotonic()
            cpu = None
            if pid in self._last_proc and ticks is not None:
                cpu = cpu_cores(self._last_proc[pid], (now, ticks))
            if ticks is not None:
                self._last_proc[pid] = (now, ticks)
            self.procs.append(ProcSample(t=time.time(), pid=pid, rss_mib=rss, cpu=cpu))


def _proc_rss_ticks(pid: int) -> tuple[float | None, int | None]:
    """Resident memory (MiB) and CPU time (ns, user + system) of ``pid`` from /proc; (None, None) when gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, None
    rss = next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:")), None)
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return (round(rss, 1) if rss is not None else None), int(ticks * 1e9 / CLK_TCK)


def _host_cpu() -> tuple[float, float] | None:
    """``(monotonic s, busy CPU seconds of the whole host)`` from /proc/stat, or None."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return time.monotonic(), (sum(values[:8]) - idle) / CLK_TCK


def host_facts(client: Any) -> dict[str, Any]:
    """The host as the benchmark found it: cores, memory (MiB, total and available), load average (1, 5,
    15 min), and the sandboxes on the engine (taken between levels: others' work)."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    kib = lambda key: int(meminfo.get(key, "0 kB").split()[0])  # noqa: E731
    others = {c.labels.get(LABEL_SANDBOX) for c in client.containers.list(ignore_removed=True, filters={"label": LABEL_SANDBOX})}
    return {"cores": os.cpu_count(), "mem_total_mib": kib("MemTotal") // 1024,
            "mem_available_mib": kib("MemAvailable") // 1024, "loadavg": [round(v, 2) for v in os.getloadavg()],
            "other_sandboxes": len(others)}


# -- the idle sandbox ---------------------------------------------------------------------------------

def measure_idle(client: Any, task: Any, image: str, samples: int, say: Callable[[str], None]) -> dict[str, Any]:
    """One sandbox laid out as ``task`` (apps launched, ready files waited for), then ``samples`` samples:
    ``{"start_s", "desktop": {mem_mib, cpu}, "gateway": {...}, "sandbox_mem_mib"}`` (each a :func:`summary`)."""
    from controller.run.verify import guest_path
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    spec = task.sandbox_spec()
    t0 = time.monotonic()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    with DockerSandbox.start(spec, DockerOptions(image=image, extra_labels={"desktop-sandbox.bench": "suite"}),
                             client=client) as sandbox:
        start_s = round(time.monotonic() - t0, 3)
        for launch in task.launch:
            sandbox.agent.launch(launch.app, launch.args)
        for ready in task.ready:
            path = guest_path(ready.file, sandbox.guest_home)
            deadline = time.monotonic() + ready.timeout_s
            while True:
                try:
                    sandbox.agent.read_file(path)
                    break
                except Exception:  # noqa: BLE001 - not there yet (404)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{path} did not appear within {ready.timeout_s:g}s") from None
                    time.sleep(0.2)  # poll interval: the file appears when the app is up
        say(f"idle sandbox {sandbox.id} ready in {start_s:.1f}s (+ apps); sampling {samples} times")
        sampler = Sampler(client, lambda: {owner}, lambda: set())
        with sampler:
            deadline = time.monotonic() + SAMPLE_S * (samples + 3) + 60
            while (len([s for s in sampler.samples if s.role == "desktop" and s.cpu is not None]) < samples
                   and time.monotonic() < deadline):
                time.sleep(0.2)  # poll interval: the sampler's own thread takes the samples
    mine = [s for s in sampler.samples if s.sandbox == sandbox.id and s.cpu is not None]
    return {"start_s": start_s, **_roles(mine), "sandbox_mem_mib": summary(_per_moment_total(mine))}


def _roles(samples: list[Sample]) -> dict[str, Any]:
    out = {}
    for role in ("desktop", "gateway"):
        of = [s for s in samples if s.role == role]
        out[role] = {"mem_mib": summary(s.mem_mib for s in of), "cpu": summary(s.cpu for s in of)}
    return out


def _per_moment_total(samples: list[Sample], key: str = "mem_mib") -> list[float]:
    """The sum over containers of each sweep of the sampler (``key``: ``mem_mib`` or ``cpu``)."""
    sweeps: dict[int, float] = {}
    for s in samples:
        sweeps[s.sweep] = sweeps.get(s.sweep, 0.0) + (getattr(s, key) or 0.0)
    return [round(v, 3) for _, v in sorted(sweeps.items())]


# -- one level: N runs at once ------------------------------------------------------------------------

def measure_level(client: Any, n: int, task_file: Path, task_name: str, image: str, runs_dir: Path,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """``n`` runs of the task, ``n`` at once (:class:`controller.suite.SuiteRunner`), sampled meanwhile.

    Returns ``{"n", "passed", "runs", "statuses", "sandbox_start_s", "wall_s" (summaries, seconds),
    "suite_wall_s", "mem_total_peak_mib" (all the level's containers at once), "controller_rss_mib",
    "host_cpu" (busy cores), "busy" (per-role summaries while the model loop ran), "records"}``."""
    from rich.console import Console

    from controller import suite

    options = suite.SuiteOptions(parallel=n, runs_dir=runs_dir, backend="docker", image=image, live=False)
    plan = suite.plan_runs([(task_name, task_file)], n)
    quiet = Console(file=open(os.devnull, "w"), width=120)  # noqa: SIM115 - closed with the process
    runner = suite.SuiteRunner(plan, options, repeat=n, console=quiet)
    host = socket.gethostname()

    def pids() -> set[int]:
        return {r.pid for r in runner.results if r.pid}

    sampler = Sampler(client, lambda: {f"{host}:{p}" for p in pids()}, pids)
    with sampler:
        report = runner.run()
    runs = report["runs"]
    windows = [_loop_window(Path(r["record_dir"])) for r in runs if r["record_dir"]]
    by_sandbox = {w[0]: w for w in windows if w}
    busy = [s for s in sampler.samples if s.cpu is not None and s.sandbox in by_sandbox
            and by_sandbox[s.sandbox][1] <= s.t <= by_sandbox[s.sandbox][2]]
    level = {
        "n": n, "passed": report["counts"]["passed"], "runs": len(runs),
        "statuses": {k: v for k, v in report["counts"].items() if v and k != "total"},
        "sandbox_start_s": summary(r["sandbox_start_s"] for r in runs),
        "wall_s": summary(r["wall_s"] for r in runs), "suite_wall_s": report["wall_s"],
        "mem_total_peak_mib": max(_per_moment_total(sampler.samples), default=None),
        "controller_rss_mib": summary(p.rss_mib for p in sampler.procs),
        "controller_cpu": summary(p.cpu for p in sampler.procs),
        "host_cpu": summary(sampler.host_cpu),
        "busy": {**_roles(busy), "sandbox_mem_mib": summary(_per_moment_total(busy)),
                 "sandbox_cpu": summary(_per_moment_total(busy, "cpu")) if n == 1 else None},
        "failures": [clean(f"{r['status']}: {r['reason']}", 300) for r in runs if r["status"] != "passed"],
        "records": [r["record_dir"] for r in runs],
    }
    say(f"N={n}: {level['passed']}/{level['runs']} passed, sandbox start p50 {level['sandbox_start_s']['p50']}s, "
        f"run-task wall p50 {level['wall_s']['p50']}s max {level['wall_s']['max']}s, "
        f"memory peak {level['mem_total_peak_mib']} MiB, host CPU p50 {level['host_cpu']['p50']} cores")
    return level


def _loop_window(record_dir: Path) -> tuple[str, float, float] | None:
    """``(sandbox id, start, end)`` (epoch s) of the model loop in a record: from the first
    ``model_response`` to the first ``check`` (or ``run_finished``); None without a sandbox or a loop."""
    try:
        lines = [json.loads(x) for x in (record_dir / "record.jsonl").read_text(encoding="utf-8").splitlines() if x]
    except (OSError, ValueError):
        return None
    sandbox = next((e.get("sandbox") for e in lines if e.get("type") == "run_started"), None)
    first = next((e["ts"] for e in lines if e.get("type") == "model_response"), None)
    last = next((e["ts"] for e in lines if e.get("type") in ("check", "run_finished")), None)
    if not (sandbox and first and last):
        return None
    epoch = lambda ts: _dt.datetime.fromisoformat(ts).timestamp()  # noqa: E731
    return sandbox, epoch(first), epoch(last)


# -- the model ----------------------------------------------------------------------------------------

def derive(report: dict[str, Any]) -> dict[str, Any]:
    """What the figures say, as numbers: ``mem_per_sandbox_idle_mib`` (desktop + gateway, median),
    ``mem_per_sandbox_busy_peak_mib`` (busy, largest), ``controller_rss_mib`` (one ``run-task`` process,
    largest), ``mem_per_run_mib`` (their sum), ``cpu_per_busy_run`` (cores: the busy sandbox's median plus
    its controller's), ``n_by_memory`` (available memory / memory per run), ``n_by_cpu`` (cores / CPU per
    busy run: beyond it runs share cores and slow down), ``largest_passing_n`` (largest level tried at which
    every run passed; None when none did), ``first_failing_n`` (smallest level with a failure; None)."""
    idle = report.get("idle") or {}
    levels = report.get("levels") or []
    one = next((lv for lv in levels if lv["n"] == 1), None)
    idle_mem = ((idle.get("sandbox_mem_mib") or {}).get("p50"))
    busy_mem = ((one or {}).get("busy", {}).get("sandbox_mem_mib") or {}).get("max")
    rss = max((lv["controller_rss_mib"]["max"] for lv in levels if lv["controller_rss_mib"]["max"]), default=None)
    busy_cpu = ((one or {}).get("busy", {}).get("sandbox_cpu") or {}).get("p50")
    ctl_cpu = ((one or {}).get("controller_cpu") or {}).get("p50")
    per_run_mem = (busy_mem or 0) + (rss or 0) if busy_mem else None
    per_run_cpu = round((busy_cpu or 0) + (ctl_cpu or 0), 3) if busy_cpu is not None else None
    host = report.get("host") or {}
    passing = [lv["n"] for lv in levels if lv["passed"] == lv["runs"]]
    failing = [lv["n"] for lv in levels if lv["passed"] != lv["runs"]]
    return {
        "mem_per_sandbox_idle_mib": idle_mem, "mem_per_sandbox_busy_peak_mib": busy_mem, "controller_rss_mib": rss,
        "mem_per_run_mib": round(per_run_mem, 1) if per_run_mem else None, "cpu_per_busy_run": per_run_cpu,
        "n_by_memory": (math.floor(host["mem_available_mib"] / per_run_mem)
                        if per_run_mem and host.get("mem_available_mib") else None),
        "n_by_cpu": (round(host["cores"] / per_run_cpu, 1) if per_run_cpu and host.get("cores") else None),
        "largest_passing_n": max(passing) if passing else None,
        "first_failing_n": min(failing) if failing else None,
    }


def render_lines(report: dict[str, Any]) -> list[str]:
    """The report as plain lines (what the command prints)."""
    h, m, idle = report["host"], report["model"], report.get("idle") or {}
    out = [f"host: {h['cores']} cores, {h['mem_total_mib']} MiB ({h['mem_available_mib']} available), load "
           f"{'/'.join(map(str, h['loadavg']))} before, {'/'.join(map(str, report['host_after']['loadavg']))} after; "
           f"{h['other_sandboxes']} other sandboxes on the engine at the start, "
           f"{report['host_after']['other_sandboxes']} at the end"]
    if idle:
        out.append(f"idle sandbox: desktop {idle['desktop']['mem_mib']['p50']} MiB, {idle['desktop']['cpu']['p50']} "
                   f"cores; gateway {idle['gateway']['mem_mib']['p50']} MiB, {idle['gateway']['cpu']['p50']} cores; "
                   f"started in {idle['start_s']}s")
    out.append("N | passed | sandbox start p50/max s | run-task wall p50/max s | suite s | memory peak MiB | "
               "host CPU p50/max cores | run-task RSS max MiB")
    for lv in report["levels"]:
        start = lv["sandbox_start_s"]
        out.append(f"{lv['n']} | {lv['passed']}/{lv['runs']} | {start['p50']}/{start['max']} | "
                   f"{lv['wall_s']['p50']}/{lv['wall_s']['max']} | {lv['suite_wall_s']} | {lv['mem_total_peak_mib']} | "
                   f"{lv['host_cpu']['p50']}/{lv['host_cpu']['max']} | {lv['controller_rss_mib']['max']}")
        for failure in lv["failures"]:
            out.append(f"    {failure}")
    one = next((lv for lv in report["levels"] if lv["n"] == 1), None)
    if one:
        b = one["busy"]
        out.append(f"busy sandbox (N=1, model loop): desktop {b['desktop']['mem_mib']['max']} MiB peak, "
                   f"{b['desktop']['cpu']['p50']} cores p50; gateway {b['gateway']['mem_mib']['max']} MiB, "
                   f"{b['gateway']['cpu']['p50']} cores; run-task process {one['controller_cpu']['p50']} cores p50")
    out.append("model: " + ", ".join(f"{k} {v}" for k, v in m.items()))
    return out


def run(levels: list[int], task_path: Path, image: str, idle_samples: int, runs_dir: Path,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark (module docstring); returns the report (``host``, ``host_after``, ``idle``,
    ``levels``, ``model``, ``task``, ``image``, ``started_at``)."""
    import docker

    from controller.run.tasks import load_task

    client = docker.from_env()
    task = load_task(task_path)
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    report: dict[str, Any] = {"task": str(task_path), "image": image, "started_at": started_at,
                              "host": host_facts(client), "levels": []}
    report["idle"] = measure_idle(client, task, image, idle_samples, say) if idle_samples else None
    for n in levels:
        report["levels"].append(measure_level(client, n, task_path, task.name, image, runs_dir, say))
    report["host_after"] = host_facts(client)
    report["model"] = derive(report)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line (module docstring). Prints the lines of :func:`render_lines`; returns the report with
    ``checks`` (``passes_alone``: every run passed at N = 1)."""
    parser = argparse.ArgumentParser(prog="desktop-sandbox bench --suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)),
                        help="runs at once to try, comma-separated (default 1,2,4,8)")
    parser.add_argument("--task", type=Path, default=DEFAULT_TASK)
    parser.add_argument("--image", default="desktop-sandbox:latest")
    parser.add_argument("--idle-samples", type=int, default=5, help="samples of the idle sandbox (0: skip it)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs") / "bench-suite")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    if not levels or min(levels) < 1:
        parser.error("--levels: positive integers, e.g. 1,2,4,8")
    report = run(levels, args.task, args.image, args.idle_samples, args.runs_dir,
                 say=lambda m: print(m, flush=True))
    one = next((lv for lv in report["levels"] if lv["n"] == 1), None)
    report["checks"] = {"passes_alone": bool(one and one["passed"] == one["runs"])}
    for line in render_lines(report):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"report written to {args.json}")
    return report


if __name__ == "__main__":
    raise SystemExit(0 if all(main()["checks"].values()) else 1)

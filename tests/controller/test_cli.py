"""CLI: ``report`` reads a record back; ``run-task`` refuses a broken task file before starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.run.record import RunRecord

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path):
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL)


def _record(tmp_path: Path, status: str) -> Path:
    rec = RunRecord(tmp_path, f"run-{status}")
    rec.write("run_started", task={"name": "demo"}, mode="offline")
    rec.write("check", kind="file", target="/home/sandbox/x", rule="text", expected="a", observed="b",
              passed=status == "passed")
    rec.finish(status, "because")
    rec.close()
    return rec.dir


def test_report_prints_the_summary_and_exit_status_follows_the_verdict(tmp_path):
    ok = _cli("report", str(_record(tmp_path, "passed")), cwd=tmp_path)
    assert ok.returncode == 0 and "1/1 passed" in ok.stdout
    bad = _cli("report", str(_record(tmp_path, "failed")), cwd=tmp_path)
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    as_json = _cli("report", str(_record(tmp_path, "cancelled")), "--json", cwd=tmp_path)
    assert '"status": "cancelled"' in as_json.stdout
    missing = _cli("report", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 2


def test_run_task_refuses_a_broken_task_file(tmp_path):
    task = tmp_path / "broken.toml"
    task.write_text('name = "x"\n')
    out = _cli("run-task", str(task), cwd=tmp_path)
    assert out.returncode == 2 and "instructions" in out.stderr


GOOD = ('name = "x"\ninstructions = "y"\n[[checks]]\nkind = "file"\npath = "~/a"\nmatch = "text"\nvalue = "a"\n')


def _offline_cli(*args: str, cwd: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "DOCKER_HOST")}
    # Anything that got as far as Docker would fail loudly on this socket instead of starting a sandbox.
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST="unix:///nonexistent/docker.sock", COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)


def _refused(out, *needles: str) -> None:
    """Exit 2, one line on stderr naming what is wrong, no traceback."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("body, needles", [
    (GOOD.replace("[[checks]]", "[[check]]"), ["t.toml", "check: unknown key", "did you mean 'checks'"]),
    ('name = "x"\ninstructions = "y"\n', ["t.toml", "checks", "at least one"]),
    (GOOD + '[network]\nmode = "[red]deny[/]"\n', ["network.mode", "(got '[red]deny[/]')"]),
    (GOOD + '[network]\nmode = "allowlist"\nallow = ["https://[/]"]\n', ["network.allow", "https://[/]"]),
    (GOOD + '[model]\ncrop = [1000, 0, 500, 100]\n', ["model.crop", "1280x800 screen"]),
    (GOOD + '[screen]\nwidth = "1280"\n', ["screen.width", "(got '1280')"]),
    (GOOD + "[[checks\n", ["t.toml", "TOML syntax error", "line 8"]),
    (GOOD, ["no [offline] script"]),
    (GOOD + '[offline]\nscript = "missing.jsonl"\n', ["missing.jsonl", "cannot read"]),
    (GOOD + '[offline]\nscript = "bad.jsonl"\n', ["bad.jsonl:2", "teleport"]),
])
def test_run_task_refuses_bad_tasks_in_one_line_before_starting_anything(tmp_path, body, needles):
    (tmp_path / "bad.jsonl").write_text('{"message": "x"}\n{"actions": [{"type": "teleport", "x": 1, "y": 1}]}\n')
    task = tmp_path / "t.toml"
    task.write_text(body)
    _refused(_offline_cli("run-task", str(task), "--offline", cwd=tmp_path), *needles)


BROWSER_TASK = ('[model]\ntools = ["browser"]\n[[launch]]\napp = "chromium"\nargs = ["http://127.0.0.1:8080/"]\n'
                '[offline]\nscript = "s.jsonl"\n')
READ = '{"browser": [{"member": "read_page", "arguments": {"filter": "all"}}]}'


@pytest.mark.parametrize("model, turns, needles", [
    # a member the SDK has but the task does not enable (set_checked is explicit-only)
    (BROWSER_TASK, [READ, '{"browser": [{"member": "set_checked", "arguments": {"target": "d1e1", "checked": true}}]}'],
     ["s.jsonl:2", "browser[0].member", "needs 'set_checked'", "browser_members"]),
    (BROWSER_TASK.replace('tools = ["browser"]', 'tools = ["browser"]\nbrowser_members = ["read_page"]'),
     [READ, '{"browser": [{"member": "read_page", "arguments": {"filter": "all"}}, '
            '{"member": "click", "arguments": {"target": "d1e1"}}]}'],
     ["s.jsonl:2", "browser[1].member", "needs 'click'", "read_page"]),
    # the members a turn uses without naming them: a description's reads, an expectation's screenshots
    (BROWSER_TASK.replace('tools = ["browser"]', 'tools = ["browser"]\nbrowser_members = ["click"]'),
     ['{"browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]}', READ],
     ["s.jsonl:1", "target (an element description)", "needs 'read_page'"]),
    (BROWSER_TASK.replace('tools = ["browser"]', 'tools = ["browser"]\nbrowser_members = ["read_page"]'),
     [READ, '{"browser": [{"member": "read_page", "arguments": {"filter": "all"}}], '
            '"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 9, "h": 9}]}'],
     ["s.jsonl:2", "expect", "needs 'screenshot'"]),
    (BROWSER_TASK, [READ, '{"actions": [{"type": "click", "button": "left", "x": 1, "y": 1}]}'], ["s.jsonl:2", "no computer tool"]),
    ('[offline]\nscript = "s.jsonl"\n', ['{"actions": [{"type": "wait"}]}', READ], ["s.jsonl:2", "no browser tool"]),
])
def test_run_task_refuses_a_script_that_calls_what_the_task_does_not_give_the_model(tmp_path, model, turns, needles):
    """The scripted model declares only the task's tools and members: a script calling another is refused
    at load, in one line naming its line, before anything starts (not as a failed run)."""
    (tmp_path / "s.jsonl").write_text("\n".join(turns) + "\n")
    task = tmp_path / "t.toml"
    task.write_text(GOOD + model)
    _refused(_offline_cli("run-task", str(task), "--offline", cwd=tmp_path), *needles)


@pytest.mark.parametrize("args, needles", [
    (["--max-steps", "0"], ["max-steps"]),
    (["--max-steps", "-3"], ["max-steps"]),
    (["--confirm-actions", "type,kepress"], ["kepress", "keypress"]),
    (["--approve-safety-check", ""], ["approve-safety-check"]),
    (["--approve-origin", "ftp://a.test"], ["--approve-origin", "unsupported scheme 'ftp'"]),
    (["--approve-origin", "https://a.test/path"], ["--approve-origin", "https://a.test/path"]),
    (["--approve-origin", "https://*.a.test"], ["--approve-origin", "wildcards are not accepted"]),
    (["--script", "nope.jsonl"], ["nope.jsonl", "cannot read"]),
    (["--backend", "qemu"], ["qemu"]),
    (["--runs-dir", "a-file"], ["runs-dir", "a-file"]),
])
def test_run_task_refuses_bad_options_in_one_line(tmp_path, args, needles):
    (tmp_path / "ok.jsonl").write_text('{"message": "x"}\n')
    (tmp_path / "a-file").write_text("not a directory")
    task = tmp_path / "t.toml"
    task.write_text(GOOD + '[offline]\nscript = "ok.jsonl"\n')
    out = _offline_cli("run-task", str(task), "--offline", *args, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr)


@pytest.mark.parametrize("body, needles", [
    ('mode = "allowlist"\nalow = ["https://a.test"]\n', ["p.toml", "alow: unknown key", "did you mean 'allow'"]),
    ('mode = "allowlist"\nallow = ["https://a.test/path"]\n', ["p.toml", "allow", "https://a.test/path"]),
    ('mode = "allow-all"\n', ["p.toml", "mode", "(got 'allow-all')"]),
    ('[network]\nmode = "allowlist"\nallow = ["https://*.a.test"]\n', ["p.toml", "wildcards"]),
    ('mode = "allowlist"\nallow = [\n', ["p.toml", "TOML"]),
])
def test_audit_refuses_bad_policy_files_in_one_line(tmp_path, body, needles):
    policy = tmp_path / "p.toml"
    policy.write_text(body)
    _refused(_offline_cli("audit", "--policy", str(policy), cwd=tmp_path), *needles)


@pytest.mark.parametrize("args, needles", [
    (["--policy", "p.toml"], ["bad policy p.toml", "mode", "(got 'allow-all')"]),
    (["--policy", "p.toml", "--task", "p.toml"], ["--policy or --task"]),
    (["--backend", "qemu"], ["qemu"]),
    ([], ["audit could not run"]),  # no Docker engine (DOCKER_HOST names no socket)
])
def test_audit_json_bad_input_exits_2_without_a_report(tmp_path, args, needles):
    (tmp_path / "p.toml").write_text('mode = "allow-all"\n')
    report = tmp_path / "report.json"
    _refused(_offline_cli("audit", *args, "--json", str(report), cwd=tmp_path), *needles)
    assert not report.exists()


def test_audit_task_option_uses_the_task_rules(tmp_path):
    task = tmp_path / "t.toml"
    task.write_text('name = "x"\ninstructions = "y"\n[network]\nmode = "allowlist"\nallow = ["https://a.test"]\n')
    _refused(_offline_cli("audit", "--task", str(task), cwd=tmp_path), "t.toml", "checks")


@pytest.mark.parametrize("content", ["[1]\n", "{not json\n", '{"type": "run_started", "task": null}\n',
                                     '{"type": "run_started", "task": "x"}\n',
                                     '{"type": "model_response", "usage": {"total_tokens": "many"}}\n',
                                     '{"type": "run_finished", "status": "passed", "wall_s": "soon"}\n'])
def test_report_on_a_damaged_record(tmp_path, content):
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.jsonl").write_text(content)
    out = _offline_cli("report", str(run), cwd=tmp_path)
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("content, modes", [
    ('{"type": "run_started", "task": ' + "[" * 100000 + "]" * 100000 + "}\n", ("", "--json")),  # too deep
    ('{"type": "run_started", "task": {"name": "x"}}\n{"type": "run_finished", "status": "passed"}\n',
     ("", "--json")),  # no ts
    ('{"type": "model_response", "usage": {"total_tokens": 1e400}}\n', ("", "--json")),  # infinite
    ('{"type": "run_finished", "ts": "2026-01-01T00:00:00+00:00", "status": "passed", "wall_s": 1e400}\n',
     ("--json",)),  # JSON has no infinity
])
def test_report_refuses_records_it_cannot_summarize_in_one_line(tmp_path, content, modes):
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.jsonl").write_text(content)
    for mode in modes:
        out = _offline_cli(*(["report", mode, str(run)] if mode else ["report", str(run)]), cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (mode, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) == 1 and "Infinity" not in out.stdout


def test_report_shows_record_text_escaped(tmp_path):
    rec = RunRecord(tmp_path, "run-evil")
    rec.write("run_started", task={"name": "demo\x1b[2J"}, mode="offline\x1b]0;t\x07")
    rec.write("check", kind="file\x1b[8m", target="/x\x1b[31m", rule="text", expected="a", observed="b" * 10**6,
              passed=False)
    rec.finish("failed", "because\x1b[2J" + "r" * 10**6)
    rec.close()
    out = _offline_cli("report", str(rec.dir), cwd=tmp_path)
    assert out.returncode == 1 and "\x1b" not in out.stdout + out.stderr
    assert "\\x1b[2J" in out.stdout and len(out.stdout) < 20000


def test_a_refused_script_is_shown_escaped_and_short(tmp_path):
    task = tmp_path / "t.toml"
    script = tmp_path / "s.jsonl"
    task.write_text((ROOT / "tasks" / "pickup.toml").read_text().replace('script = "pickup.offline.jsonl"',
                                                                         f'script = "{script}"'))
    script.write_text('{"actions": [{"type": "wait"}]}\n' + '{"expect": [{"kind": "\\u001b[31mRED' + "x" * 100000
                      + '", "x": 0, "y": 0, "w": 1, "h": 1}], "message": "m"}\n')
    out = _offline_cli("run-task", str(task), "--offline", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "\x1b" not in out.stderr and "\\x1b[31mRED" in out.stderr and len(out.stderr) < 2000


# A backend whose every answer quotes the guest: start fails with the console's last lines, removal
# names what it removed, the audit fails with a container's output.
HOSTILE_BACKEND = r"""
import types
from controller.sandbox import BackendUnavailable, SandboxError
from tests.controller.hostile_text import EVIL

class Hostile:
    backend_name = "docker"
    default_ready_timeout = 1.0

    @classmethod
    def make_options(cls, **kw):
        return types.SimpleNamespace(image=None)

    @classmethod
    def ensure_image(cls, options, say):
        say("pulling " + EVIL)
        return options

    @classmethod
    def start(cls, spec, options):
        raise SandboxError("desktop exited; last output:\n" + EVIL + "\nlast line")

    @classmethod
    def remove(cls, sandbox_id):
        return [EVIL]

class Gone(Hostile):
    backend_name = "vm"

    @classmethod
    def remove(cls, sandbox_id):
        raise BackendUnavailable("no VM directory: " + EVIL)
"""


def _hostile_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed command (``cli.app``, as the console script calls it) with the hostile backends."""
    child = HOSTILE_BACKEND + (
        "\nfrom controller import cli, sandbox\nimport controller.audit.backends as audit_backends\n"
        "import controller.sandbox.registry as registry\n"
        "registry.get_backend = lambda name: Gone if name == 'vm' else Hostile\n"
        "registry.backend_names = lambda: ['docker', 'vm']\n"
        "def audit(network, image):\n    raise SandboxError('gateway exited:\\n' + EVIL)\n"
        "audit_backends.audit_function = lambda backend: audit\n"
        "import sys\ncli.app(sys.argv[1:], prog_name='desktop-sandbox')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(tmp_path), COLUMNS="200")
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-c", child, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)


def test_an_uncaught_error_quoting_the_guest_is_shown_escaped_line_by_line(tmp_path):
    """A failed start of ``up`` is one error (exit 1) quoting the guest's output with each line escaped,
    no traceback (typer's own traceback printed the message raw)."""
    from tests.controller.hostile_text import SHOWN, assert_shown_safely

    out = _hostile_cli(tmp_path, "up")
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "cannot start the sandbox: desktop exited; last output:\n" in out.stderr, out.stderr
    assert_shown_safely(out.stderr + out.stdout)
    assert SHOWN in out.stderr and "\nlast line" in out.stderr


def test_audit_and_down_show_backend_text_escaped_and_literally(tmp_path):
    from tests.controller.hostile_text import SHOWN, assert_shown_safely

    audit = _hostile_cli(tmp_path, "audit")
    assert audit.returncode == 2 and "audit could not run: gateway exited:\n" + SHOWN in audit.stderr, audit.stderr
    assert "pulling " + SHOWN in audit.stderr
    down = _hostile_cli(tmp_path, "down", "ds-0000aaaa")
    assert down.returncode == 0, down.stderr
    assert "removed 1: " + SHOWN in down.stderr and "skipped vm: no VM directory: " + SHOWN in down.stderr
    for out in (audit, down):
        assert_shown_safely(out.stderr + out.stdout)


@pytest.mark.parametrize("bad_id", ["*", "dv", "dv-*", "dv-aaaa1111-r1/../other/*", "../../../victim", "ds-1",
                                    "dv-aaaa1111/..", "ds-AAAA1111", "ds-aaaa1111\n", "dk-*", "dx-aaaa1111"])
def test_down_refuses_what_is_not_a_sandbox_id_and_touches_nothing(tmp_path, bad_id):
    """An id is used in glob patterns and file names: anything but ``ds-``/``dv-``/``dk-`` + 8 hex is refused
    (exit 2) before any backend is asked, so no sandbox, directory or file outside them is removed."""
    tmp, runtime = tmp_path / "tmp", tmp_path / "run"
    for name in ("desktop-sandbox-vm-dv-aaaa1111-r1", "desktop-sandbox-vm-dv-bbbb2222-r2", "other"):
        (tmp / name).mkdir(parents=True)
        (tmp / name / "keep").write_text("x")
    (runtime / "desktop-sandbox").mkdir(parents=True)
    victim = tmp_path / "victim.token"
    victim.write_text("x")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(runtime))
    out = subprocess.run([sys.executable, "-m", "controller.cli", "down", bad_id, "--backend", "vm"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "not a sandbox id" in out.stderr, out.stderr
    assert all((tmp / n / "keep").exists() for n in ("desktop-sandbox-vm-dv-aaaa1111-r1",
                                                       "desktop-sandbox-vm-dv-bbbb2222-r2", "other"))
    assert victim.exists()


def test_down_of_one_vm_id_removes_only_that_sandbox(tmp_path):
    tmp = tmp_path / "tmp"
    for name in ("desktop-sandbox-vm-dv-aaaa1111-r1", "desktop-sandbox-vm-dv-aaaa11112-r2"):
        (tmp / name).mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    out = subprocess.run([sys.executable, "-m", "controller.cli", "down", "dv-aaaa1111", "--backend", "vm"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert not (tmp / "desktop-sandbox-vm-dv-aaaa1111-r1").exists()
    assert (tmp / "desktop-sandbox-vm-dv-aaaa11112-r2").exists()  # a longer id with the same prefix stays


def test_audit_on_a_backend_without_an_audit_is_refused_in_one_line(tmp_path):
    """The Kubernetes backend has no network audit: exit 2 with a sentence, no traceback, nothing started."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "controller.cli", "audit", "--backend", "kubernetes"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    assert "has no network audit" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_down_of_a_kubernetes_id_is_accepted_when_no_cluster_is_configured(tmp_path):
    """``dk-`` ids are sandbox ids: ``down dk-…`` asks the backend (none configured here, so nothing is
    found: exit 2 "no such sandbox", not the id refusal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKTOP_SANDBOX_K8S")}
    env.update(PYTHONPATH=str(ROOT), KUBECONFIG=str(tmp_path / "none"))
    out = subprocess.run([sys.executable, "-m", "controller.cli", "down", "dk-aaaa1111", "--backend", "kubernetes"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert "not a sandbox id" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr

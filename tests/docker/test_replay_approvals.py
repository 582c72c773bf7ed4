"""``desktop-sandbox replay`` of runs that were asked questions, end to end in Docker: a replay does what
the recorded run did and was allowed, never more. tasks/approval-demo.toml recorded denied (no
approver), withdrawn (cancelled from the console while its safety check waited) and approved (opt-in):
the denied and the withdrawn records replay without typing anything (the desktop's file is absent
afterwards), ending as their runs did, with an ``approval`` line; the approved one replays and passes
with ``--approve-safety-check CODE`` and is denied without an approver. tasks/sign-in-demo.toml (the demo
site in a container of ours) recorded answered from a ``--sign-in`` file replays unattended with
``--sign-in FILE``, no value anywhere."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import load_task
from tests.helpers import run_signin_site

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"
APPROVAL_FILE = "/home/sandbox/Documents/approval.txt"
SIGNIN_VALUES = ("sandbox-demo-pass", "person@example.test")
"""The demo site's account (images/signin-demo/site.py): password, e-mail."""


def replay_cli(record_dir: Path, desktop_image: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    """The real command line, stdin /dev/null (no terminal), no API key in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "controller.cli", "replay", str(record_dir), "--image", desktop_image,
                           "--runs-dir", str(runs), *extra], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def rows(output: str) -> list[tuple[str, str]]:
    """(state, detail) of each row of the per-step table (a detail wrapped onto more lines joined)."""
    found: list[tuple[str, str]] = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        cells = cells[1:-1] if len(cells) > 2 else cells
        if len(cells) >= 4 and cells[0].isdigit() and cells[2] in ("matched", "diverged", "denied", "not reached"):
            found.append((cells[2], cells[3]))
        elif found and len(cells) >= 4 and not any(cells[:3]) and cells[3]:
            found[-1] = (found[-1][0], f"{found[-1][1]} {cells[3]}")
    return found


@pytest.fixture(scope="module")
def opener(docker_client, desktop_image, test_labels):
    """``open(task)`` for run_task: a fresh labelled sandbox; each is closed when the module ends."""
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    started: list[Any] = []

    def open_(task: Any) -> Any:
        sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        started.append(sb)
        return sb

    yield open_
    for sb in started:
        sb.close()


def record_approval_demo(opener: Any, runs: Path, on_live: Any = None, **options: Any) -> Any:
    """tasks/approval-demo.toml recorded (no terminal) with ``options`` (``on_live``: given the run's
    console view); returns its outcome."""
    return run_task(load_task(TASKS / "approval-demo.toml"), opener,
                    RunOptions(runs_dir=runs, live=False, terminal=False, **options),
                    console=Console(file=io.StringIO(), width=200), views=[watching(on_live)] if on_live else [])


@pytest.fixture(scope="module")
def approved_record(opener, tmp_path_factory) -> Path:
    outcome = record_approval_demo(opener, tmp_path_factory.mktemp("approved"), approve_codes=["sensitive_action"])
    assert outcome.status == "passed", outcome.reason
    return outcome.record_dir


class _Kept:
    """The replay's sandbox as its run sees it, except that the run's teardown leaves it standing: the test
    reads the desktop's files afterwards, then closes it."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)

    def close(self) -> None:
        pass


def replay_keeping_the_desktop(record_dir: Path, opener: Any, runs: Path, capsys: Any) -> tuple[int, str, Path, Any]:
    """``desktop-sandbox replay``'s own code (no terminal) on a sandbox kept after its run: ``(exit status,
    what it printed, the replay's record, the sandbox)``."""
    from controller.commands.replay import replay_run

    kept: list[_Kept] = []

    def keep(_backend: str, _image: Any, **_: Any) -> Any:
        def open_(task: Any) -> Any:
            kept.append(_Kept(opener(task)))
            return kept[-1]
        return open_

    with pytest.raises(typer.Exit) as done:
        replay_run(record_dir, image_tag=None, backend="docker", runs_dir=runs, write_task_to=None, opener=keep,
                   terminal=False)
    out = capsys.readouterr()
    return done.value.exit_code, out.out + out.err, Path(out.out.strip().splitlines()[-1]), kept[0].sandbox


def assert_nothing_typed(sandbox: Any) -> None:
    from controller.run.verify import GuestFileMissing

    with pytest.raises(Exception) as missing:
        sandbox.agent.read_file(APPROVAL_FILE)
    assert isinstance(missing.value, GuestFileMissing) or getattr(missing.value, "status", None) == 404, missing.value


def test_a_denied_run_replays_to_the_same_denial_without_typing(opener, tmp_path, capsys):
    recorded = record_approval_demo(opener, tmp_path / "recorded")
    assert recorded.status == "failed" and "denied by no-approver" in recorded.reason
    code, output, replayed, sandbox = replay_keeping_the_desktop(recorded.record_dir, opener, tmp_path / "replays",
                                                                 capsys)
    assert_nothing_typed(sandbox)
    assert code == 1, output[-3000:]
    assert rows(output) == [("matched", "1 region(s)"), (
        "matched", "safety check denied by replay, as the recorded run's (denied by no-approver): not performed")], output
    assert "run failed (recorded: failed)" in output
    entries = read_entries(replayed)
    [approval] = [e for e in entries if e.type == "approval"]
    assert (approval.what, approval.decision, approval.by, approval.call_id) == (
        "safety_check", "denied", "replay", "call_0001")
    assert not [e for e in entries if e.type == "action" and e.call_id == "call_0001"]
    assert entries[-1].status == "failed" and "denied by replay" in entries[-1].reason


def test_a_withdrawn_run_replays_to_the_same_stop_without_typing(opener, tmp_path, capsys):
    def on_live(view: Any) -> None:
        """A person cancels the run from the console while its safety check waits for an answer."""
        def cancel(request: Any) -> None:
            if request.kind == "safety_check" and request.pending:
                threading.Thread(target=view.cancel, daemon=True).start()
        view.registry.subscribe(cancel)

    recorded = record_approval_demo(opener, tmp_path / "recorded", on_live=on_live)
    assert recorded.status == "cancelled", recorded.reason
    code, output, replayed, sandbox = replay_keeping_the_desktop(recorded.record_dir, opener, tmp_path / "replays",
                                                                 capsys)
    assert_nothing_typed(sandbox)
    assert code == 1, output[-3000:]  # the replay stopped where its record did: not a cancellation of the replay
    [(first, _), (second, detail)] = rows(output)
    assert (first, second) == ("matched", "matched") and "withdrawn" in detail and "not performed" in detail, output
    assert "run cancelled (recorded: cancelled)" in output
    entries = read_entries(replayed)
    [approval] = [e for e in entries if e.type == "approval"]
    assert (approval.decision, approval.message) == ("withdrawn", "cancelled by replay")
    assert entries[-1].status == "cancelled"


def test_an_approved_run_replays_with_its_code_and_is_denied_without_an_approver(approved_record, desktop_image,
                                                                                  tmp_path):
    done = replay_cli(approved_record, desktop_image, tmp_path / "with-code", "--approve-safety-check",
                      "sensitive_action")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert [state for state, _ in rows(output)] == ["matched", "matched"]
    assert "2 of 2 steps matched; checks: 1 of 1 passed; run passed" in done.stderr
    entries = read_entries(Path(done.stdout.strip().splitlines()[-1]))
    assert [(e.what, e.by) for e in entries if e.type == "approval"] == [
        ("opt-in", "command line"), ("safety_check", "opt-in")]
    done = replay_cli(approved_record, desktop_image, tmp_path / "nobody")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert rows(output)[1][0] == "denied" and "denied by no-approver" in rows(output)[1][1], output[-3000:]
    entries = read_entries(Path(done.stdout.strip().splitlines()[-1]))
    assert [(e.decision, e.by) for e in entries if e.type == "approval"] == [("denied", "no-approver")]
    assert [c.passed for c in entries if c.type == "check"] == [False]  # nothing was typed


@pytest.fixture(scope="module")
def signin_site(docker_client, desktop_image, test_labels):
    """(network name, subnet) of the sign-in demo site's network (only the gateways join it)."""
    ident = f"ds-test-replay-signin-{secrets.token_hex(4)}"
    network = docker_client.networks.create(ident, driver="bridge", internal=True, labels=test_labels)
    container = None
    try:
        network.reload()
        subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
        container = run_signin_site(docker_client, desktop_image, network.name, f"{ident}-site", test_labels)
        yield network.name, subnet
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def test_a_sign_in_run_replays_unattended_with_a_sign_in_file(signin_site, docker_client, desktop_image,
                                                                test_labels, tmp_path):
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    network_name, subnet = signin_site
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "sign-in-demo.toml").write_text((TASKS / "sign-in-demo.toml").read_text().replace(
        'allow_addresses = ["10.213.78.0/24"]', f'allow_addresses = ["{subnet}"]'))
    (folder / "sign-in-demo.offline.jsonl").write_text((TASKS / "sign-in-demo.offline.jsonl").read_text())
    creds = tmp_path / "sign-in.toml"
    creds.write_text(f'["http://signin-demo:8080"]\nmethod = "password"\nemail = "{SIGNIN_VALUES[1]}"\n'
                     f'password = "{SIGNIN_VALUES[0]}"\n')
    creds.chmod(0o600)

    def open_(task: Any) -> Any:
        sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        sb.attach_gateway(network_name)
        return sb

    recorded = run_task(load_task(folder / "sign-in-demo.toml"), open_,
                        RunOptions(runs_dir=tmp_path / "recorded", live=False, terminal=False, sign_in_file=creds),
                        console=Console(file=io.StringIO(), width=200))
    assert recorded.status == "passed", recorded.reason
    done = replay_cli(recorded.record_dir, desktop_image, tmp_path / "replays", "--attach-network", network_name,
                      "--sign-in", str(creds))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert [state for state, _ in rows(output)] == ["matched"]
    entries = read_entries(Path(done.stdout.strip().splitlines()[-1]))
    assert [(e.step, e.outcome, e.by) for e in entries if e.type == "sign_in"] == [
        (n, "submitted", "sign-in file") for n in (1, 2, 3)]
    shown = output + "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "replays").rglob("*") if p.is_file())
    assert not [v for v in SIGNIN_VALUES if v in shown]

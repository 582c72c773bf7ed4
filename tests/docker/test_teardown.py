"""Teardown leaves no container or network with our label: after an exception, SIGTERM, and SIGKILL;
after SIGKILL of a real ``run-task`` or ``up`` (nothing in them could clean up), ``down ID`` and
``down --all`` remove what they left, token file included; a detached ``up`` stays (also through the
next start's reaping) until ``down --all``. Reaping at the next start removes only sandboxes whose owner
is provably dead and this host's: never one labelled with another machine's id or with a live pid
that started at another time, even when the old ``host:pid`` owner label says dead here. (Signals the
command can handle, at every phase: test_signal_sweep.py.)"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, LABEL_SANDBOX, SandboxError, SandboxSpec
from controller.sandbox.docker import DockerOptions, DockerSandbox, reap_orphans, remove_sandbox
from controller.sandbox.owner import boot_id, machine_id, pid_namespace, process_start

from tests.helpers import exited_process

from ._cli_run import RUNS, CliRun, entries
from .conftest import record_ready

REPO = Path(__file__).resolve().parents[2]

_STARTER = """
import json, signal, sys
from controller.sandbox import SandboxSpec
from controller.sandbox.docker import DockerOptions, DockerSandbox
labels = json.loads(sys.argv[2])
with DockerSandbox.start(SandboxSpec(), DockerOptions(image=sys.argv[1], extra_labels=labels)) as sb:
    print(json.dumps({"id": sb.id, "timings": sb.timings}), flush=True)
    while True:
        signal.pause()
"""


def _leftovers(client, sandbox_id: str) -> list[str]:
    flt = {"label": f"{LABEL_SANDBOX}={sandbox_id}"}
    return [c.name for c in client.containers.list(all=True, ignore_removed=True, filters=flt)] + [
        n.name for n in client.networks.list(filters=flt)
    ]


def _start_in_subprocess(image: str, labels: dict[str, str]) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _STARTER, image, json.dumps(labels)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(f"sandbox subprocess exited: {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line)


def test_teardown_after_failed_start(docker_client, desktop_image, test_labels):
    """A start that fails (here: readiness timeout) removes what it created before raising."""
    marker = {**test_labels, "desktop-sandbox.case": f"failed-start-{os.getpid()}"}
    with pytest.raises(SandboxError, match="not ready"):
        DockerSandbox.start(SandboxSpec(ready_timeout=0.01),
                            DockerOptions(image=desktop_image, extra_labels=marker), client=docker_client)
    flt = {"label": f"desktop-sandbox.case={marker['desktop-sandbox.case']}"}
    assert docker_client.containers.list(all=True, ignore_removed=True, filters=flt) == []
    assert docker_client.networks.list(filters=flt) == []


def test_teardown_on_sigterm(docker_client, desktop_image, test_labels):
    proc, info = _start_in_subprocess(desktop_image, test_labels)
    record_ready(f"subprocess sandbox {info['id']}", info["timings"])
    assert _leftovers(docker_client, info["id"]), "sandbox should exist while its process runs"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert _leftovers(docker_client, info["id"]) == []


def test_killed_run_is_reaped(docker_client, desktop_image, test_labels):
    """SIGKILL skips all teardown; the next start (reap_orphans) removes the orphan."""
    proc, info = _start_in_subprocess(desktop_image, test_labels)
    proc.kill()
    proc.wait(timeout=30)
    assert _leftovers(docker_client, info["id"]), "SIGKILL cannot clean up; the orphan must still be there"
    reaped = reap_orphans(docker_client)
    assert info["id"] in reaped
    assert _leftovers(docker_client, info["id"]) == []


def test_cli_down_removes_a_sandbox(docker_client, test_labels):
    """`desktop-sandbox down ID` removes everything labelled with that id (here: a leftover network)."""
    sandbox_id = f"ds-{secrets.token_hex(4)}"  # an id as the backend makes them (`down` accepts no other)
    docker_client.networks.create(f"{sandbox_id}-internal", internal=True,
                                  labels={LABEL_SANDBOX: sandbox_id, **test_labels})
    out = subprocess.run([sys.executable, "-m", "controller.cli", "down", sandbox_id], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _leftovers(docker_client, sandbox_id) == []
    # the same id again (or a mistyped one) names nothing: said, exit 2
    again = subprocess.run([sys.executable, "-m", "controller.cli", "down", sandbox_id], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and f"no sandbox {sandbox_id}" in again.stderr, again.stderr


def _down(run: CliRun, *args: str) -> subprocess.CompletedProcess[str]:
    """``desktop-sandbox down ARGS`` with the environment of ``run`` (its token file directory)."""
    return subprocess.run([sys.executable, "-m", "controller.cli", "down", *args], cwd=REPO, env=run.env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_down_id_after_a_killed_run_task(cli_run, desktop_image):
    """``run-task`` SIGKILLed in its loop leaves its whole sandbox (and a record without an end);
    ``down ID`` removes all of it."""
    run = cli_run("run-task", REPO / "tasks" / "pickup.toml", "--offline", "--image", desktop_image,
                  "--runs-dir", RUNS)
    run.wait_for("the first action", entries("action"))
    run.kill()
    record = run.entries()
    sandbox_id = record[0]["sandbox"]
    parts = sorted(f"{sandbox_id}-{p}" for p in ("desktop", "gateway", "internal", "egress"))
    assert sorted(run.leftovers()) == parts, "SIGKILL cannot clean up: the sandbox must still be there"
    assert record[-1]["type"] != "run_finished"
    done = _down(run, sandbox_id)
    # another test's start on this engine may reap the dead run's sandbox meanwhile (its owner is provably
    # dead): `down` then removes what is still there, and nothing of it may be left either way
    assert done.returncode == 0 or f"no sandbox {sandbox_id}" in done.stderr, done.stderr
    said = done.stderr.split(": ", 1)[1].split() if done.returncode == 0 else []
    assert {name.strip(",") for name in said} <= set(parts) and (said or done.returncode != 0), done.stderr
    run.assert_nothing_left()


@pytest.mark.slow
def test_down_all_after_a_killed_up(cli_run, desktop_image, docker_client, test_labels):
    """``up`` SIGKILLed leaves its sandbox and its token file; ``down --all`` removes both. ``--label``
    narrows it to what this one process started (its owner label), so sandboxes of other sessions on
    this engine survive the test -- checked with one carrying another owner."""
    run = cli_run("up", "--image", desktop_image)
    run.wait_for("the token file", lambda r: bool(r.token_files()))
    run.kill()
    assert run.leftovers() and run.token_files(), "SIGKILL cannot clean up: sandbox and token file remain"
    other = f"ds-{secrets.token_hex(4)}"
    docker_client.networks.create(f"{other}-internal", internal=True,
                                  labels={LABEL_SANDBOX: other, LABEL_OWNER: "elsewhere:1", **test_labels})
    try:
        assert _down(run, "--label", f"{LABEL_OWNER}={run.owner}").returncode == 2  # --label needs --all
        done = _down(run, "--all", "--label", f"{LABEL_OWNER}={run.owner}")
        assert done.returncode == 0, done.stderr
        run.assert_nothing_left()
        assert _leftovers(docker_client, other) == [f"{other}-internal"], "a sandbox without the label went too"
    finally:
        remove_sandbox(docker_client, other)


def test_down_all_with_a_label_removes_token_files_whose_sandbox_is_gone(docker_client, test_labels, tmp_path):
    """A killed ``up``'s sandbox can be reaped by another start (its owner provably dead) before ``down
    --all --label ...`` comes: its token file, and any other naming a sandbox that exists nowhere, goes
    too; the token file of a sandbox that is still there (another owner's) stays, and so does one of a
    backend that cannot be asked."""
    alive = f"ds-{secrets.token_hex(4)}"
    docker_client.networks.create(f"{alive}-internal", internal=True,
                                  labels={LABEL_SANDBOX: alive, LABEL_OWNER: "elsewhere:1", **test_labels})
    tokens = tmp_path / "xdg" / "desktop-sandbox"
    tokens.mkdir(parents=True)
    names = {sid: tokens / f"{sid}.token" for sid in
             (alive, f"ds-{secrets.token_hex(4)}", f"ds-audit-{secrets.token_hex(4)}", f"dv-{secrets.token_hex(4)}",
              f"dk-{secrets.token_hex(4)}")}
    for path in names.values():
        path.write_text("t")
    (tokens / "notes.token").write_text("not a sandbox's")
    odd = tokens / f"ds-{secrets.token_hex(4)}.token"
    odd.mkdir()  # a gone id's name on something that is no file: kept and said, never a traceback
    # a cluster configured at a loopback port nothing listens on: the kubernetes backend cannot be asked
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{closed_port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "sandboxes"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "KUBECONFIG": str(kubeconfig)}
    try:
        for backend in ("docker", "vm", None):
            args = ["--all", "--label", f"{LABEL_OWNER}=nobody:{secrets.token_hex(4)}"]
            args += ["--backend", backend] if backend else []
            done = subprocess.run([sys.executable, "-m", "controller.cli", "down", *args], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr, done.stderr
            assert (f"kept {odd}: Is a directory" in done.stderr) == (backend != "vm"), done.stderr
            left = sorted(p.stem for p in tokens.glob("*.token") if p != odd)
            gone_prefixes = {"docker": ("ds-",), "vm": ("ds-", "dv-"), None: ("ds-", "dv-")}[backend]
            assert left == sorted({alive, "notes"} | {sid for sid in names if sid.startswith("dk-")}
                                  | {sid for sid in names if not sid.startswith(gone_prefixes)}), (backend, left)
        assert _leftovers(docker_client, alive) == [f"{alive}-internal"], "a sandbox of another owner went"
    finally:
        remove_sandbox(docker_client, alive)


def test_reaping_takes_only_what_is_provably_dead_and_ours(docker_client, test_labels):
    """Leftover networks as killed runs leave them; all carry an old-style owner label ``<this host
    name>:<exited pid>`` (what a shared engine's other users with the same host name look like). Only
    the one whose owner id is this machine's, boot's and pid namespace's, with an exited pid, goes."""
    pid, start = exited_process()
    here = f"{machine_id()}:{boot_id()}:{pid_namespace()}"
    other_machine = "0" * 32 if machine_id() != "0" * 32 else "1" * 32
    me = os.getpid()
    owners = {
        "dead": f"{here}:{pid}:{start}",
        "other-machine": f"{other_machine}:{boot_id()}:{pid_namespace()}:{pid}:{start}",
        "reused-pid": f"{here}:{me}:{int(process_start(me)) + 1}",
        "no-owner-id": None,
    }
    stamp = f"{os.getpid():x}{int(time.time() * 1000) % 10**8:x}"
    ids = {case: f"ds-reap-{case}-{stamp}" for case in owners}
    try:
        for case, owner in owners.items():
            labels = {LABEL_SANDBOX: ids[case], LABEL_OWNER: f"{socket.gethostname()}:{pid}", **test_labels}
            if owner:
                labels[LABEL_OWNER_ID] = owner
            docker_client.networks.create(f"{ids[case]}-internal", internal=True, labels=labels)
        reaped = reap_orphans(docker_client)
        assert ids["dead"] in reaped and _leftovers(docker_client, ids["dead"]) == []
        for case in ("other-machine", "reused-pid", "no-owner-id"):
            assert ids[case] not in reaped, f"{case}: taken for dead and ours"
            assert _leftovers(docker_client, ids[case]) == [f"{ids[case]}-internal"], case
    finally:
        for sandbox_id in ids.values():
            remove_sandbox(docker_client, sandbox_id)


@pytest.mark.slow
def test_down_all_after_a_detached_up(cli_run, desktop_image, docker_client):
    """``up --backend docker --detach`` exits 0 leaving its sandbox (the next start's reaping keeps it:
    detached); ``down --all`` (narrowed to its owner so other sessions survive) removes all of it."""
    run = cli_run("up", "--backend", "docker", "--detach", "--image", desktop_image)
    assert run.finish() == 0, run.err()
    sandbox_id = run.stdout[-1].strip()
    parts = sorted(f"{sandbox_id}-{p}" for p in ("desktop", "gateway", "internal", "egress"))
    assert sorted(run.leftovers()) == parts and run.token_files()
    assert sandbox_id not in reap_orphans(docker_client)
    done = _down(run, "--all", "--label", f"{LABEL_OWNER}={run.owner}")
    assert done.returncode == 0, done.stderr
    run.assert_nothing_left()

"""Where a :class:`desktop_sandbox.Sandbox` comes from and where it goes: claimed from a warm pool
(``pool=``: the pool's ready sandbox, its apps already up, the claim in its record), and saved then forked
(``fork()``: new sandboxes holding the saved files, each removed when closed)."""

from __future__ import annotations

from typing import Any

from tests.docker.conftest import IMAGE, SESSION_ID, TEST_LABEL

LABELS = {TEST_LABEL: SESSION_ID}


def _containers(docker_client: Any, sandbox_id: str) -> list[Any]:
    return docker_client.containers.list(all=True, filters={"label": f"desktop-sandbox.sandbox={sandbox_id}"})


def test_a_sandbox_claimed_from_a_warm_pool(docker_client, desktop_image, tmp_path):
    from controller.run.record import read_entries
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.pool import Template, WarmPool
    from desktop_sandbox import Sandbox
    from desktop_sandbox._sandbox import _task_for

    task = _task_for(None, policy=None, apps=["terminal"], screen=None, browser=False)
    options = DockerSandbox.make_options(image=IMAGE)
    options.extra_labels = {**options.extra_labels, **LABELS}
    launch, ready = task.pool_apps()
    pool = WarmPool(DockerSandbox, options, [Template.of(task.sandbox_spec(), launch, ready)], 1).start()
    try:
        pool.wait_ready(1, timeout=180)
        with Sandbox.start(apps=["terminal"], pool=pool, runs_dir=tmp_path, image=IMAGE) as sb:
            assert sb.provenance["source"] == "pool" and sb.provenance["launched"]
            assert sb.screenshot().width == 1280
            record, sandbox_id = sb.record_dir / "record.jsonl", sb.id
        assert _containers(docker_client, sandbox_id) == []
        started = next(e for e in read_entries(record) if e.type == "run_started")
        assert started.claim["source"] == "pool"
    finally:
        pool.close()


def test_a_saved_sandbox_forks_into_sandboxes_holding_its_files(docker_client, desktop_image, tmp_path,
                                                                 monkeypatch):
    from desktop_sandbox import Sandbox

    monkeypatch.setenv("DESKTOP_SANDBOX_SNAPSHOTS", str(tmp_path / "snapshots"))
    with Sandbox.start(runs_dir=tmp_path, image=IMAGE, options={"extra_labels": LABELS}) as sb:
        sb.backend.exec_in_guest(["sh", "-c", "mkdir -p ~/Documents && echo saved > ~/Documents/note.txt"],
                                 timeout=30)
        (fork,) = sb.fork(1)
        try:
            assert fork.id != sb.id
            assert fork.read_file("/home/sandbox/Documents/note.txt") == b"saved\n"
            fork.click(10, 10)
        finally:
            fork.close()
        assert _containers(docker_client, fork.id) == []
        assert sb.read_file("/home/sandbox/Documents/note.txt") == b"saved\n"  # the source goes on

"""Where a :class:`desktop_sandbox.Sandbox` comes from and where it goes: claimed from a warm pool
(``pool=``: the pool's ready sandbox, its apps already up, the claim in its record), saved then forked
(``fork()``: new sandboxes holding the saved files, each removed when closed), and what it may write
(``writable=``: only under those folders, links planted in the guest followed)."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_files_are_written_only_under_the_writable_folders(docker_client, desktop_image, tmp_path):
    from desktop_sandbox import Sandbox, TaskError

    with pytest.raises(TaskError):
        Sandbox.start(writable=["/etc"], image=IMAGE)  # refused before anything starts
    with Sandbox.start(runs_dir=tmp_path, image=IMAGE, writable=["~/inbox"], confirm_actions=["screenshot"],
                       options={"extra_labels": LABELS}) as sb:
        from desktop_sandbox import ActionDenied

        with pytest.raises(ActionDenied, match="nobody can be asked .give Sandbox.start an approver"):
            sb.screenshot()  # a confirmed screenshot with nobody to ask: refused, saying what to do
        blob = bytes(range(256)) * 800  # 200 KiB: several chunks
        assert sb.write_file("~/inbox/deep/data.bin", blob) == "/home/sandbox/inbox/deep/data.bin"
        assert sb.read_file("/home/sandbox/inbox/deep/data.bin") == blob
        sb.write_file("~/inbox/deep/data.bin", b"replaced")
        assert sb.read_file("/home/sandbox/inbox/deep/data.bin") == b"replaced"
        sb.backend.exec_in_guest(["ln", "-s", "/home/sandbox/.config", "/home/sandbox/inbox/escape"], timeout=20)
        for outside in ("~/.bashrc", "/tmp/x", "~/inbox/../outside.txt", "~/inbox/escape/evil.txt"):
            with pytest.raises(PermissionError):
                sb.write_file(outside, b"no")
        listing = sb.backend.exec_in_guest(["sh", "-c", "ls -a ~/.config ~ /tmp"], timeout=20).stdout.decode()
        assert "evil.txt" not in listing and "outside.txt" not in listing and "\nx\n" not in listing
        with pytest.raises(ValueError):
            sb.write_file("~/inbox/big", b"\0" * (8 * 1024 * 1024 + 1))
        sb.click(5, 5)  # still usable

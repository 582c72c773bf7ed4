"""Two removers of one sandbox at once (two processes reaping the same abandoned sandbox, ``down`` beside a
start), against the real engine: each returns without an error and nothing of the sandbox is left, while
the containers one of them is removing still hold the sandbox's network."""

from __future__ import annotations

import secrets
import threading

import pytest

from controller.sandbox import LABEL_SANDBOX
from controller.sandbox.docker_cleanup import remove_sandbox

pytestmark = [pytest.mark.docker]

CONTAINERS = 3


def test_two_removers_at_once_both_end_and_leave_nothing(docker_client, desktop_image, test_labels):
    for _round in range(3):
        sandbox_id = f"ds-{secrets.token_hex(4)}"
        labels = {**test_labels, LABEL_SANDBOX: sandbox_id}
        network = docker_client.networks.create(f"{sandbox_id}-internal", internal=True, labels=labels)
        for n in range(CONTAINERS):  # stopped by SIGKILL only, as a guest's processes may be
            docker_client.containers.run(desktop_image, ["sleep", "600"], entrypoint=[], detach=True,
                                         name=f"{sandbox_id}-part{n}", labels=labels, network=network.name)
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def remove() -> None:
            start.wait(10)
            try:
                remove_sandbox(docker_client, sandbox_id)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=remove) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}) == []
        assert docker_client.networks.list(filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}) == []

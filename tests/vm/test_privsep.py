"""The agent is not the desktop user's, on the VM guest too: the Docker module's checks
(tests/docker/test_privsep.py), each acting as the desktop user `sandbox` inside the guest
(``exec_in_guest``: qemu-guest-agent, ``runuser -u sandbox``), against the session's VM sandbox.
The checks that need a command run as root or as another user (the launch broker from root, the display
without a cookie) are Docker's only."""

from __future__ import annotations

import pytest

from tests.docker.test_privsep import (  # noqa: F401 - collected here against the VM
    test_agent_runs_as_its_own_user_and_launches_as_the_desktop_user,
    test_desktop_user_cannot_read_the_token,
    test_desktop_user_cannot_signal_the_agent,
    test_desktop_user_cannot_stop_the_agent_through_supervisor,
    test_desktop_user_cannot_take_the_agent_port,
    test_desktop_user_cannot_trace_the_agent,
)


@pytest.fixture
def sandbox(vm_sandbox):
    """The session's VM sandbox under the name the shared checks use."""
    return vm_sandbox

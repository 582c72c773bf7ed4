"""Conformance suite ``tests/conformance/test_pointer.py`` against the agent in the VM."""

from tests.conformance.test_pointer import *  # noqa: F401,F403
from tests.docker._conformance import _nothing_left_pressed, probe, sink  # noqa: F401

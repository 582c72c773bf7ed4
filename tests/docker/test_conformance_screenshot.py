"""Conformance suite ``tests/conformance/test_screenshot.py`` against the agent in the container (see _conformance.py)."""

from tests.conformance.test_screenshot import *  # noqa: F401,F403

from ._conformance import _nothing_left_pressed, probe, sink  # noqa: F401

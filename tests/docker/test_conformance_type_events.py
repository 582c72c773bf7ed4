"""Conformance suite ``tests/conformance/test_type_events.py`` against the agent in the container (see _conformance.py)."""

from tests.conformance.test_type_events import *  # noqa: F401,F403

from ._conformance import _nothing_left_pressed, probe, sink  # noqa: F401

"""Conformance suite ``tests/conformance/test_wait_release.py`` against the agent in the container (see _conformance.py)."""

from tests.conformance.test_wait_release import *  # noqa: F401,F403

from ._conformance import _nothing_left_pressed, probe, sink  # noqa: F401

del test_release_lets_go_of_keys_and_buttons_pressed_elsewhere  # noqa: F821 - needs a local X connection

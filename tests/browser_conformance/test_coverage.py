"""Every default member of the SDK (``openai.lib.browser.DEFAULT_BROWSER_MEMBERS``), and every
explicit-only member of :data:`tests.browser_conformance.harness.EXPLICIT_SERVED` the driver serves, was
called successfully by the suite's tests on each target. Runs after them (conftest.py); a member no
test exercised, or whose every call failed, fails it."""

from __future__ import annotations

from openai.lib import browser as sdk

from .conftest import EXERCISED, SERVED
from .harness import EXPLICIT_SERVED


def test_every_member_is_exercised(target_spec):
    served = SERVED.get(target_spec, ())
    required = set(sdk.DEFAULT_BROWSER_MEMBERS) | (set(EXPLICIT_SERVED) & set(served))
    missing = sorted(required - EXERCISED.get(target_spec, set()))
    assert not missing, f"members no test exercised successfully on {target_spec}: {missing}"

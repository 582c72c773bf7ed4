"""The scripted model's call ids (contract 3), read back by replay and by a record's summary.

Turn ``NNNN`` of a script is ``call_NNNN``; the scripted model's own waits for that turn's screen are
``call_NNNN_wait_KKK`` (screenshots) or ``call_NNNN_read_KKK`` (browser reads), and they come before it.
"""

from __future__ import annotations

import re

SCRIPT_CALL = re.compile(r"^call_(\d{4})$")
"""A scripted model's call id for script turn ``NNNN``."""
SCRIPTED_WAIT = re.compile(r"^call_\d{4}_(wait|read)_\d+$")
"""Call ids of the scripted model's own waits: not steps of the run, unless they carry a turn's
``expect_retry`` actions."""
STEP_OF_CALL = re.compile(r"^call_(\d{4})(?:_(?:wait|read)_\d+)?$")
"""A replay's call id and the step it belongs to: step NNNN's own call, or one of the scripted model's
waits for that step's screen (which come before it)."""

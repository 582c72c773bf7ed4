"""A scripted model whose responses hold several computer calls at once (a batch), for the Agent
Framework tests: the offline scripted server's model (request checks, ``previous_response_id``
conversations, loopback server) with another answer.

``BatchModel(batches)``: ``batches[k]`` is the list of calls (``{"actions": [...],
"pending_safety_checks": [...]}``) of the k-th computer response; call ``j`` of batch ``k`` gets the
call id ``call_<k><a+j>`` (``call_0a``, ``call_0b``, ...). Once every call of the batches so far has
its ``computer_call_output`` in the conversation, the next batch is answered, then the final message.
Like the real API (and the scripted model) it refuses a request whose outputs do not acknowledge
exactly their call's pending checks.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from controller.offline.scripted_server import ScriptedModel


def call_id(batch: int, index: int) -> str:
    """The call id of call ``index`` of batch ``batch`` (``call_0a``)."""
    return f"call_{batch}{chr(ord('a') + index)}"


class BatchModel(ScriptedModel):
    """See the module docstring. ``final``: the text of the final message."""

    def __init__(self, batches: list[list[dict[str, Any]]], final: str = "done") -> None:
        super().__init__([{"message": final}])
        self.batches = batches
        self.final = final

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        problem = self._validate_request(body)
        if problem is not None:
            return self._refuse(*problem)
        items = body.get("input") if isinstance(body.get("input"), list) else []
        answered = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "computer_call_output")
        k = done = 0
        while k < len(self.batches) and done + len(self.batches[k]) <= answered:
            done += len(self.batches[k])
            k += 1
        if k >= len(self.batches):
            output: list[dict[str, Any]] = [{
                "type": "message", "id": f"msg_{uuid.uuid4().hex[:8]}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": self.final, "annotations": []}]}]
        else:
            output = [{"type": "computer_call", "id": f"cu_{call_id(k, j)}_{uuid.uuid4().hex[:6]}",
                       "call_id": call_id(k, j), "status": "completed", "actions": c["actions"],
                       "pending_safety_checks": c.get("pending_safety_checks", [])}
                      for j, c in enumerate(self.batches[k])]
        created = time.time()
        return 200, {"id": f"resp_{uuid.uuid4().hex[:12]}", "object": "response", "created_at": created,
                     "status": "completed", "model": self.model, "output": output, "parallel_tool_calls": True,
                     "tool_choice": "auto", "tools": body.get("tools", []), "error": None,
                     "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": None,
                     "top_p": None}

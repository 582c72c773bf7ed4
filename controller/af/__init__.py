"""Agent Framework on the sandbox: an agent's native computer calls, with the run's approvals and record.

Optional: needs the ``[af]`` extra (``agent-framework-core`` and ``agent-framework-openai``, pinned in
``pyproject.toml``); importing this package without them raises ImportError.

* :mod:`controller.af.executor` -- :class:`ComputerCallExecutor`: ``computer_tool_call`` Contents run on
  the sandbox through the SDK's ``ComputerToolset`` with the approval registry's callbacks; exact
  acknowledgements only; batches in order; no call run twice.
* :mod:`controller.af.sessions` -- :class:`AgentComputerUse` (a plain agent on one ``AgentSession``) and
  :class:`WorkflowComputerUse` (a workflow's ``request_info`` computer requests, cancelled through the
  framework, across checkpoints).
* :mod:`controller.af.loop` -- :func:`run_loop`, the model loop of ``run-task --runner agent-framework``.
* :mod:`controller.af.computer` -- :class:`SandboxComputer`, the pieces for an agent of your own on a
  sandbox you started (``desktop-sandbox up``).

The framework marks its computer-use types experimental and warns once per process; that warning
(``[COMPUTER_USE]``) is silenced here, and only that one.
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore", message=r"\[COMPUTER_USE\]")

from controller.af.computer import SandboxComputer  # noqa: E402
from controller.af.executor import (  # noqa: E402
    AcknowledgementError, BatchOutcome, ComputerCallExecutor, attempted_calls, check_acknowledgement,
    computer_result, native_call,
)
from controller.af.loop import run_loop  # noqa: E402
from controller.af.sessions import (  # noqa: E402
    AgentComputerUse, StepLimit, Turn, UnansweredRequest, WorkflowComputerUse, computer_requests,
)

__all__ = [
    "AcknowledgementError", "AgentComputerUse", "BatchOutcome", "ComputerCallExecutor", "SandboxComputer",
    "StepLimit", "Turn", "UnansweredRequest", "WorkflowComputerUse", "attempted_calls", "check_acknowledgement",
    "computer_requests", "computer_result", "native_call", "run_loop",
]

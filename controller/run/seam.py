"""What a run adds around its driver's calls, in one place (the driver's one seam).

:class:`RunSeam` is the run's :class:`controller.run.driver.DriverSeam`: each action the driver sends is
published on the run's bus (:class:`controller.run.bus.ActionSent`), each screenshot the model gets goes
to the record (:meth:`controller.run.recording.RecordingHooks.on_screenshot`), and the run's parts join
in by name, each optional:

- ``gates`` at each step boundary, in order: a replay's person's actions
  (:class:`controller.run.replay.HumanReplayer`), the web console's take-over
  (:meth:`controller.run.live.LiveRun.checkpoint`);
- ``waits`` before each capture, in order: pending origin requests
  (:func:`controller.run.origins.wait_for_origins`), the sign-in flow
  (:class:`controller.run.signin.SignInFlow`);
- ``rebind`` when the agent refused a bound action (:class:`controller.run.binding.BoundApprovals`);
- ``network``, the gateway's decisions followed into the record
  (:class:`controller.run.recording.DecisionTail`): held from each action's sending to its record line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from controller.run.bus import ActionSent, RunBus
from controller.run.driver import DriverSeam, SentScreenshot

if TYPE_CHECKING:
    from controller.run.recording import DecisionTail


class RunSeam(DriverSeam):
    """The run's seam on its driver (module docstring). ``bus``: the run's bus; ``on_screenshot``: what
    keeps each screenshot sent (the record's hooks)."""

    def __init__(self, bus: RunBus, on_screenshot: Callable[[SentScreenshot], None] | None = None) -> None:
        self.bus = bus
        self.on_screenshot = on_screenshot
        self.gates: list[Callable[[bool], Any]] = []
        self.waits: list[Callable[[], bool]] = []
        self.rebind: Callable[[Any], bool] | None = None
        self.network: "DecisionTail | None" = None

    @property
    def waits_before_capture(self) -> bool:  # type: ignore[override]
        return bool(self.waits)

    def step_boundary(self, screenshot: bool) -> bool:
        """Every gate runs, in order; True when any says the desktop may have changed."""
        changed = False
        for gate in self.gates:
            changed = bool(gate(screenshot)) or changed
        return changed

    def forwarding(self, actions: list[dict[str, Any]]) -> None:
        if self.network is not None:
            self.network.hold()
        for action in actions:
            self.bus.publish(ActionSent(dict(action), "model"))

    def before_capture(self) -> bool:
        """Every wait runs, in order; True when any waited or asked."""
        waited = False
        for wait in self.waits:
            waited = bool(wait()) or waited
        return waited

    def screen_changed(self, error: Any) -> bool:
        if self.network is not None:  # nothing of the action ran; asking again may take a while
            self.network.release()
        return self.rebind(error) if self.rebind is not None else False

    def screenshot_sent(self, shot: SentScreenshot) -> None:
        if self.on_screenshot is not None:
            self.on_screenshot(shot)

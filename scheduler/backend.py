"""The seam: a ``Backend`` runs the scheduler's ``StepPlan`` and reports a ``StepResult``.

Every loop drives an instance the same way::

    plan = scheduler.schedule(now, max_steps)
    result = backend.execute(plan, stop_at)
    finished = scheduler.complete(plan, result, now)

Two implementations: ``sim.backend.SimBackend`` (step times from the cost model) and
``executor.model_runner.ModelRunner`` (the model on real kernels, measured times). The loops
that call them: ``sim.instance.Instance`` (the simulator), ``executor.engine.LLMEngine.step``
(the server, warm-up and validation replay) and ``executor.calibrate`` (synthetic plans).
"""

from __future__ import annotations

from typing import Protocol

from scheduler.plan import StepPlan, StepResult


class Backend(Protocol):
    """Runs plans: prices them in simulated time or runs them on a device."""

    def execute(self, plan: StepPlan, stop_at: float | None = None) -> StepResult:
        """Run ``plan.num_steps`` steps back to back; with ``stop_at`` (the backend's clock), stop
        after the first step that ends at/after it. Fewer steps also when a request stops early."""
        ...

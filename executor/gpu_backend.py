"""The executor's side of the seam: ``GpuBackend.execute(plan) -> StepResult``, like the simulator's backend.

Named for its usual device; it runs wherever the model runner's device is (CPU in CI).
"""

from __future__ import annotations

from executor.model_runner import ModelRunner
from scheduler.plan import StepPlan, StepResult


class GpuBackend:
    """Runs plans on real kernels and reports measured step times and real token ids."""

    def __init__(self, runner: ModelRunner, step_log=None):
        self.runner = runner
        self.step_log = step_log   # callable(dict) per executed step, or None

    def execute(self, plan: StepPlan) -> StepResult:
        """Run ``plan.num_steps`` steps back to back (fewer if a request stops early)."""
        result = self.runner.execute(plan)
        if self.step_log is not None:
            for rec in self.runner.step_records:
                self.step_log(rec)
        return result

"""Each target sized inside its own guard: one the policy cannot plan is set aside, the rest are
planned as usual. Pure: time is an argument, no I/O.

The policy plans all targets together (they share the cluster), so a single odd target (say a
`capacity_rps` so small its replica count overflows) makes the whole `plan()` raise. Only
then, each target is planned alone against the same cluster to find which ones raise; those
are left out of the plan and remembered with the exact item that failed, so later plans leave
them out at once instead of searching again, until their settings change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tideshift.services.planner.core import (
    Decision,
    PlanInputs,
    ServingWorkload,
    Target,
    TrainingJob,
)
from tideshift.services.planner.core.baselines import Policy

Item = ServingWorkload | TrainingJob
REASON_LIMIT = 300  # characters of the error kept in a skipped target's reason


@dataclass
class Quarantine:
    """Targets the policy could not plan: the exact item that failed and why."""

    items: dict[Target, tuple[Item, str]] = field(default_factory=dict)

    def reasons(self) -> dict[Target, str]:
        return {target: reason for target, (_, reason) in self.items.items()}

    def plan(
        self, policy: Policy[Any], inputs: PlanInputs, state: Any, now: float
    ) -> tuple[Decision, Any, dict[Target, str]]:
        """The policy's plan without the targets it cannot plan, and why each was skipped.

        Raises what the policy raised if no single target explains the failure."""
        items: list[Item] = [*inputs.serving, *inputs.jobs]
        # Forget targets that left or changed: a changed item gets its chance again.
        self.items = {
            item.target: self.items[item.target]
            for item in items
            if item.target in self.items and self.items[item.target][0] == item
        }
        try:
            decision, state = policy.plan(_without(inputs, self.items), state, now)
        except Exception:
            self.items.update(_unplannable(policy, inputs, now))
            if not self.items:
                raise
            decision, state = policy.plan(_without(inputs, self.items), state, now)
        return decision, state, self.reasons()


def _without(inputs: PlanInputs, skipped: Mapping[Target, object]) -> PlanInputs:
    if not skipped:
        return inputs
    return replace(
        inputs,
        serving=tuple(w for w in inputs.serving if w.target not in skipped),
        jobs=tuple(j for j in inputs.jobs if j.target not in skipped),
    )


def _unplannable(
    policy: Policy[Any], inputs: PlanInputs, now: float
) -> dict[Target, tuple[Item, str]]:
    """Each target planned alone (from a fresh policy state): those that raise, and why."""
    found: dict[Target, tuple[Item, str]] = {}
    alone: list[tuple[Item, PlanInputs]] = [
        *((w, replace(inputs, serving=(w,), jobs=())) for w in inputs.serving),
        *((j, replace(inputs, serving=(), jobs=(j,))) for j in inputs.jobs),
    ]
    for item, single in alone:
        try:
            policy.plan(single, policy.initial_state(), now)
        except Exception as error:
            text = " ".join(f"{type(error).__name__}: {error}".split())[:REASON_LIMIT]
            found[item.target] = (item, f"skipped: cannot be planned ({text})")
    return found

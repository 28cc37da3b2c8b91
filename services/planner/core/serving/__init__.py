"""Serving: how many replicas each serving workload gets and where they go.

* `replicas`: sizing from the forecast and the priced headroom, the safety net (panic
  window), the scale-down rules, placement per node, and the words of each decision;
* `headroom`: the rises and onsets a workload's observed demand shows, and the rise priced
  into its headroom (a quantile of its rises, or a recurring onset when the next is due);
* `warm`: what the headroom learned, kept across a planner's restart.

Imports the shared model (`model`, `packing`, `peaks`) only: never training or lending.
"""

from tideshift.services.planner.core.serving.replicas import (
    PANIC,
    ServingPlan,
    place_serving,
    plan_serving,
    size_serving,
    track_miss,
)

__all__ = ["PANIC", "ServingPlan", "place_serving", "plan_serving", "size_serving", "track_miss"]

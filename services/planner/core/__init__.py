"""Tideshift's capacity policy: serving first from the forecast, the rest to elastic training.

Pure decision modules, grouped by the decision they make (no I/O, no clock; must not import
asyncio, NATS, Kubernetes, the bus or the simulated cluster). `plan(inputs, state, now)` in
`plan.py` composes them, top to bottom:

* `serving/`: serving replicas from the forecast and the priced headroom, the safety net,
  scale-down, placement per node; the rises and onsets headroom is priced on, kept across
  restarts (`serving.warm`);
* `training/`: per priority tier, fair shares, gangs, shortest-remaining-first, the churn
  limits and whether growth pays its restarts; how long serving's free room lasts; which
  finite jobs wait; a job's remaining work from its progress;
* `lending/`: GPU serving replicas nothing needs lent to finite GPU jobs, and batch jobs on
  serving's idle reservation;
* shared by all three: `model` (the vocabulary: targets, the columnar cluster view,
  workloads, forecasts, inputs, state, decision), `packing` (per-node packing as the
  scheduler packs, the cluster's pods as per-node entries) and `peaks` (reading a forecast).

Beside the policy, for the planner's shell: `state` (what the planner knows from its events),
`inputs` (cluster state to `PlanInputs`), `targets`, `isolation` (targets left out of a plan)
and `baselines` (the other policies `simulate` compares). The import rules between these are
import-linter contracts in pyproject.toml.

Inputs come in columnar form (`ClusterView`, numpy arrays) so a plan over 5,000 nodes and
150,000 pods stays well under 100 ms; `ClusterView.build` makes one from plain records.
"""

from tideshift.services.planner.core.model import (
    DEFAULT_SERVING_QUANTILE,
    RESOURCE_NAMES,
    BoolArray,
    ClusterView,
    Decision,
    FloatArray,
    Forecast,
    Infeasible,
    IntArray,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    PolicyConfig,
    Role,
    ServingWorkload,
    Target,
    TargetDecision,
    TrainingJob,
    Vector,
)
from tideshift.services.planner.core.packing import (
    ClusterEntries,
    cluster_entries,
    cluster_usage,
    managed_targets,
    node_sums,
    pack_sparse,
    slots_per_node,
    stranded_capacity,
)
from tideshift.services.planner.core.peaks import forecast_peak
from tideshift.services.planner.core.plan import plan

__all__ = [
    "DEFAULT_SERVING_QUANTILE",
    "RESOURCE_NAMES",
    "BoolArray",
    "ClusterEntries",
    "ClusterView",
    "Decision",
    "FloatArray",
    "Forecast",
    "Infeasible",
    "IntArray",
    "NodeSpec",
    "PlanInputs",
    "PlanState",
    "PodSpec",
    "PolicyConfig",
    "Role",
    "ServingWorkload",
    "Target",
    "TargetDecision",
    "TrainingJob",
    "Vector",
    "cluster_entries",
    "cluster_usage",
    "forecast_peak",
    "managed_targets",
    "node_sums",
    "pack_sparse",
    "plan",
    "slots_per_node",
    "stranded_capacity",
]

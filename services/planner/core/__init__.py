"""Tideshift's capacity policy: serving first from the forecast, the rest to elastic training.

Pure decision modules, one per decision (no I/O, no clock; must not import asyncio, NATS,
Kubernetes, the bus or the simulated cluster):

* `model`: targets, the columnar cluster view, workloads, forecasts, inputs, state, decision;
* `serving`: serving sizing from the forecast and its placement;
* `packing`: per-node packing as the scheduler packs, scale-down victims that free whole
  nodes, stranded capacity, and the cluster's pods as per-node entries;
* `tiers`: tier solving, weighted dominant-resource fairness and gangs;
* `churn`: how far rebalancing goes, limits on voluntary removals and small growth;
* `training`: one tier's trainers kept, solved, limited and decided;
* `batch`: jobs that opted into batch capacity, planned on what serving does not use;
* `reasons`: the words of each decision;
* `plan`: `plan(inputs, state, now)`, the outline of docs/DESIGN.md's "The planner's model".

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
from tideshift.services.planner.core.plan import plan
from tideshift.services.planner.core.serving import forecast_peak

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

"""kwok's fake nodes: their manifests, the default fleet, and when one is schedulable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideshift.services.devcluster.scheduler_profile import GPU_NODE_LABEL

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_LABEL = "type"


@dataclass(frozen=True)
class NodeSpec:
    """A kwok-managed fake node. Quantities use Kubernetes notation ("8", "32Gi")."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    max_pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    # Each taint is {"key": ..., "value": ..., "effect": "NoSchedule" | "NoExecute" | ...}.
    taints: Sequence[Mapping[str, str]] = ()

    def manifest(self) -> dict[str, Any]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}
        if self.gpus:
            capacity["nvidia.com/gpu"] = str(self.gpus)
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            KWOK_NODE_LABEL: "kwok",
            **self.labels,
        }
        # Node status may be set on create (unlike most kinds); kwok's node-initialize stage
        # keeps capacity and fills in conditions, addresses and nodeInfo.
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            },
            "spec": {"taints": [dict(taint) for taint in self.taints]},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
            },
        }


def default_nodes(
    count: int,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    gpu_nodes: int = 0,
    gpus_per_node: int = 4,
    labels: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    """`count` CPU nodes kwok-node-<i>, then `gpu_nodes` GPU nodes kwok-gpu-node-<i>."""
    extra = dict(labels or {})
    nodes = [NodeSpec(f"kwok-node-{i}", cpu=cpu, memory=memory, labels=extra) for i in range(count)]
    # GPU_NODE_LABEL as GPU feature discovery sets it: the packing profile keys on it
    gpu_labels = {**extra, "tideshift.io/accelerator": "nvidia", GPU_NODE_LABEL: "true"}
    nodes += [
        NodeSpec(
            f"kwok-gpu-node-{i}", cpu=cpu, memory=memory, gpus=gpus_per_node, labels=gpu_labels
        )
        for i in range(gpu_nodes)
    ]
    return nodes


def node_schedulable(node: Any) -> bool:
    ready = any(
        condition.type == "Ready" and condition.status == "True"
        for condition in (node.status.conditions or [])
    )
    not_ready_taint = any(
        taint.key.startswith("node.kubernetes.io/") for taint in (node.spec.taints or [])
    )
    return ready and not not_ready_taint

"""The `tideshift-packing` kube-scheduler profile, beside the default one: training pods that
name it are packed onto the busiest node that fits (NodeResourcesFit `MostAllocated`, GPUs
weighted 3), CPU-only pods prefer nodes without GPUs, and nothing spreads pods on purpose.
It is the scheduler's side of `cluster.core.placement`, the model the planner and the simulator
use. The chart ships the same profile (`charts/tideshift/files/scheduler-packing.yaml`) for
users' clusters; a test keeps the two equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PACKING_SCHEDULER = "tideshift-packing"
# Set by GPU feature discovery on nodes with NVIDIA GPUs; CPU-only pods avoid those nodes.
GPU_NODE_LABEL = "nvidia.com/gpu.present"


def packing_profile() -> dict[str, Any]:
    """One entry of `KubeSchedulerConfiguration.profiles`."""
    return {
        "schedulerName": PACKING_SCHEDULER,
        "plugins": {
            "score": {
                # spreading plugins work against packing
                "disabled": [
                    {"name": "NodeResourcesBalancedAllocation"},
                    {"name": "PodTopologySpread"},
                ],
                "enabled": [
                    {"name": "NodeResourcesFit", "weight": 1},
                    # a GPU node only once no CPU node fits: outweighs the fullness score
                    {"name": "NodeAffinity", "weight": 10},
                ],
            }
        },
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "MostAllocated",
                        "resources": [
                            {"name": "cpu", "weight": 1},
                            {"name": "memory", "weight": 1},
                            {"name": "nvidia.com/gpu", "weight": 3},
                        ],
                    }
                },
            },
            {
                "name": "NodeAffinity",
                "args": {
                    "addedAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "preference": {
                                    "matchExpressions": [
                                        {"key": GPU_NODE_LABEL, "operator": "DoesNotExist"}
                                    ]
                                },
                            }
                        ]
                    }
                },
            },
        ],
    }


def write_scheduler_config(path: Path, kubeconfig: Path) -> Path:
    """A KubeSchedulerConfiguration with the default profile and the packing one. With
    `--config`, kube-scheduler ignores its `--kubeconfig` and `--leader-elect` flags, so the
    file carries both."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}, packing_profile()],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path

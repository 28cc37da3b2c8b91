"""ClusterTable (incremental columnar cluster) gives the same view as a rebuild."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.core import ClusterView, NodeSpec, PodSpec, Target
from tideshift.services.planner.core.inputs import ClusterTable


def test_incremental_table_matches_a_full_rebuild() -> None:
    rng = np.random.default_rng(5)
    table = ClusterTable(pod_capacity=4)
    nodes: dict[str, NodeSpec] = {}
    pods: dict[tuple[str, str], PodSpec] = {}
    owners = [None, Target("a", "Deployment", "web"), Target("b", "PyTorchJob", "job")]
    for step in range(600):
        action = rng.integers(0, 4)
        if action == 0:
            name = f"n{rng.integers(0, 6)}"
            spec = NodeSpec(name, (float(rng.integers(1, 9)), 8.0, 0.0))
            nodes[name] = spec
            table.upsert_node(name, spec.allocatable, schedulable=True)
        elif action in (1, 2):
            key = ("ns", f"p{rng.integers(0, 40)}")
            node = f"n{rng.integers(0, 6)}" if rng.random() < 0.8 else None
            owner = owners[int(rng.integers(0, 3))]
            replica = bool(rng.random() < 0.8)
            spec_pod = PodSpec((float(step % 3 + 1), 1.0, 0.0), node, owner, replica)
            pods[key] = spec_pod
            table.upsert_pod(
                key, node=node, requests=spec_pod.requests, owner=owner, replica=replica
            )
        else:
            key = ("ns", f"p{rng.integers(0, 40)}")
            pods.pop(key, None)
            table.remove_pod(key)
    view = table.view()
    assert len(table) == len(pods)
    # Compare per-node bound requests and per-owner replica counts with a rebuild.
    known_nodes = [nodes.get(name, NodeSpec(name, (0.0, 0.0, 0.0))) for name in view.node_names]
    rebuilt = ClusterView.build(known_nodes, pods.values())
    assert np.allclose(view.allocatable, rebuilt.allocatable)

    def per_node(v: ClusterView) -> np.ndarray:
        bound = v.pod_node >= 0
        return np.bincount(
            v.pod_node[bound], weights=v.pod_requests[bound, 0], minlength=len(v.node_names)
        )

    def per_owner(v: ClusterView) -> dict[Target, int]:
        counts: dict[Target, int] = {}
        for owner, replica in zip(v.pod_owner, v.pod_replica, strict=True):
            if owner >= 0 and replica:
                counts[v.owners[owner]] = counts.get(v.owners[owner], 0) + 1
        return counts

    assert np.allclose(per_node(view), per_node(rebuilt))
    assert per_owner(view) == per_owner(rebuilt)

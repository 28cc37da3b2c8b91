"""Opens the real cluster's port for a service entry point.

Services receive a `ClusterPort`; this is the one place that picks the Kubernetes adapter, so
no service imports the adapter or the Kubernetes client itself (an import-linter contract).
"""

from __future__ import annotations

import asyncio

from tideshift.services.cluster.adapters.packing import KubernetesPackingWriter
from tideshift.services.cluster.kubernetes import KubernetesClusterPort, WatchTuning
from tideshift.services.cluster.port import ClusterPort


async def open_kubernetes(
    kubeconfig: str | None,
    *,
    context: str | None = None,
    namespace: str | None = None,
    label_selector: str | None = None,
    resync_seconds: float | None = None,
) -> ClusterPort:
    """A port on the cluster of `kubeconfig` (else `$KUBECONFIG`, `~/.kube/config`, in-cluster)."""
    tuning = WatchTuning(resync_seconds=resync_seconds) if resync_seconds is not None else None
    return await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig,
        kubeconfig,
        context=context,
        namespace=namespace,
        label_selector=label_selector,
        tuning=tuning,
    )


def packing_writer(port: ClusterPort) -> KubernetesPackingWriter | None:
    """Deletion-cost and Node extended-resource writes on `port`'s cluster; None when `port` is
    not a Kubernetes one (the simulated cluster models both itself)."""
    if isinstance(port, KubernetesClusterPort):
        return KubernetesPackingWriter(port.http)
    return None

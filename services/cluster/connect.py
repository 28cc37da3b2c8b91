"""Opens the real cluster's port for a service entry point.

Services receive a port; this is the one place that picks the Kubernetes adapter, so no
service imports the adapter or the Kubernetes client itself (an import-linter contract).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tideshift.services.cluster.informer import WatchTuning
from tideshift.services.cluster.kubernetes import KubernetesClusterPort


async def open_kubernetes(
    kubeconfig: str | None,
    *,
    context: str | None = None,
    namespace: str | Sequence[str] | None = None,
    label_selector: str | None = None,
    resync_seconds: float | None = None,
    follow: bool = False,
) -> KubernetesClusterPort:
    """A port on the cluster of `kubeconfig` (else `$KUBECONFIG`, `~/.kube/config`, in-cluster);
    its `packing_writer()` writes deletion costs and Node extended resources there. It lists
    and watches `namespace` (one, or several), else the whole cluster. `follow`: a service that
    lists nodes and pods often and never watches keeps them followed, and lists from cache."""
    tuning = WatchTuning(resync_seconds=resync_seconds) if resync_seconds is not None else None
    return await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig,
        kubeconfig,
        context=context,
        namespace=namespace,
        label_selector=label_selector,
        tuning=tuning,
        follow=follow,
    )

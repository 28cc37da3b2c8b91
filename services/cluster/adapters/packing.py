"""Writes that help the scheduler pack: `controller.kubernetes.io/pod-deletion-cost` on the pods
a scale-down should remove first, and extended resources on a Node's status."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import quote

import urllib3
from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp, status_of
from tideshift.services.cluster.port import ClusterError

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# Answers after which a later try may succeed.
_TRANSIENT = frozenset({409, 429, 500, 502, 503, 504})


class KubernetesPackingWriter:
    """Pod deletion costs and Node extended resources on a real cluster. Errors come as the
    port's own: KeyError (the object is gone) or ClusterError(transient=...)."""

    def __init__(self, http: KubeHttp) -> None:
        self.http = http

    def _patch(self, what: str, path: str, body: object) -> None:
        try:
            self.http.json("PATCH", path, body=body, content_type=MERGE_PATCH)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            status = status_of(error)
            if status == 404:
                raise KeyError(f"{what} not found") from error
            reason = getattr(error, "reason", None) or type(error).__name__
            raise ClusterError(
                f"patch {what}: " + (f"HTTP {status} {reason}" if status else str(reason)),
                transient=status is None or status in _TRANSIENT,
                status=status,
            ) from error

    async def set_deletion_cost(self, namespace: str, name: str, cost: int) -> None:
        """The ReplicaSet controller deletes the pods with the lowest cost first."""
        body = {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        await asyncio.to_thread(self._patch, f"pod {namespace}/{name}", path, body)

    async def set_node_resources(self, node: str, amounts: Mapping[str, int]) -> None:
        """Advertise integer extended resources as the capacity and allocatable of `node`."""
        values = {name: str(amount) for name, amount in amounts.items()}
        body = {"status": {"capacity": values, "allocatable": values}}
        path = f"/api/v1/nodes/{quote(node)}/status"
        await asyncio.to_thread(self._patch, f"node {node}", path, body)

"""Other autoscalers on a real cluster: list HorizontalPodAutoscalers (autoscaling/v2) and
KEDA ScaledObjects (keda.sh/v1alpha1), find those on one target, and write an autoscaler's
bounds. The rules (what they target, yield or steer, which bounds) are
`cluster.core.autoscalers`; this module only talks to the apiserver. Blocking calls run in
threads.

A kind the cluster does not serve (no KEDA, or a KEDA whose CRD serves another version: the
v1alpha1 path answers 404) or that the role may not list (403) is skipped and said once; an
object that cannot be read (a malformed scaleTargetRef) is logged, counted and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp, status_of
from tideshift.services.cluster.adapters.targets import TargetAdapter
from tideshift.services.cluster.core.autoscalers import (
    HPA_API_VERSION,
    HPA_KIND,
    KEDA_API_VERSION,
    SCALED_OBJECT_KIND,
    Autoscaler,
    AutoscalerKind,
    BadAutoscaler,
    Bounds,
    Verdict,
    autoscaler_from_object,
    bounds_patch,
    claims,
    mode_of,
    user_max_of,
    verdict,
)
from tideshift.services.cluster.port import ClusterError, WorkloadRef

log = logging.getLogger("tideshift.cluster.autoscalers")

SKIPPED = Counter(
    "tideshift_autoscalers_skipped_total",
    "HPAs and ScaledObjects that could not be read (e.g. a malformed scaleTargetRef), "
    "skipped; each object and problem counted once",
    ["kind"],
)
UNSERVED = Counter(
    "tideshift_autoscalers_unlisted_total",
    "Listings of an autoscaler kind the cluster does not serve (404) or the role may not "
    "list (403): that kind is not looked for",
    ["kind", "status"],
)
TOLD_LIMIT = 10_000
UNLISTED_RECHECK_S = 60.0
TRANSIENT = frozenset({409, 429, 500, 502, 503, 504})

PATHS: dict[AutoscalerKind, tuple[str, str]] = {
    HPA_KIND: (f"/apis/{HPA_API_VERSION}", "horizontalpodautoscalers"),
    SCALED_OBJECT_KIND: (f"/apis/{KEDA_API_VERSION}", "scaledobjects"),
}


def collection(kind: AutoscalerKind, namespace: str | None) -> str:
    prefix, plural = PATHS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


@dataclass
class Listing:
    """Every autoscaler read, and what could not be (one line each)."""

    autoscalers: list[Autoscaler] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class KubernetesAutoscalers:
    """HPAs and ScaledObjects of some namespaces (None: the whole cluster)."""

    def __init__(
        self,
        http: KubeHttp,
        *,
        namespaces: Sequence[str | None] = (None,),
        adapters: Mapping[str, TargetAdapter] | None = None,
    ) -> None:
        self.http = http
        self.namespaces = list(namespaces) or [None]
        self.adapters = dict(adapters or {})
        self._said: set[tuple[str, int | None]] = set()
        # A kind not served or not granted is asked for again only after UNLISTED_RECHECK_S
        # (a KEDA installed later is found then): the executor asks before every write.
        self._unlisted: dict[tuple[AutoscalerKind, str | None], tuple[float, str]] = {}
        # The unreadable objects already told (their problem), so a bad object listed every
        # period is logged and counted once, not once a listing; bounded.
        self._told: set[str] = set()

    # -- reading ---------------------------------------------------------------------------

    def _list_kind(self, kind: AutoscalerKind, namespace: str | None, listing: Listing) -> None:
        known = self._unlisted.get((kind, namespace))
        if known is not None and time.monotonic() < known[0]:
            listing.problems.append(known[1])
            return
        try:
            page = self.http.get(collection(kind, namespace))
        except ApiException as error:
            status = status_of(error)
            if status not in (403, 404):
                raise
            UNSERVED.labels(kind, str(status)).inc()
            words = (
                "not served here (no KEDA, or not at keda.sh/v1alpha1)"
                if status == 404
                else ("not granted to this role")
            )
            problem = f"{kind}: {words}; not looked for"
            if (kind, status) not in self._said:
                self._said.add((kind, status))
                log.info("%s", problem)
            listing.problems.append(problem)
            if len(self._unlisted) >= TOLD_LIMIT:
                self._unlisted.clear()
            self._unlisted[(kind, namespace)] = (time.monotonic() + UNLISTED_RECHECK_S, problem)
            return
        self._unlisted.pop((kind, namespace), None)
        for raw in page.get("items") or []:
            try:
                listing.autoscalers.append(autoscaler_from_object(raw, kind))
            except BadAutoscaler as error:
                listing.problems.append(str(error))
                if str(error) in self._told:
                    continue
                if len(self._told) >= TOLD_LIMIT:
                    self._told.clear()
                self._told.add(str(error))
                SKIPPED.labels(kind).inc()
                log.warning("skipping %s: %s", kind, error)

    def list_blocking(self, namespace: str | None = None) -> Listing:
        """Every HPA and ScaledObject (of `namespace`, else of the namespaces watched).
        Raises ClusterError when the apiserver cannot answer."""
        listing = Listing()
        scopes = [namespace] if namespace is not None else self.namespaces
        try:
            for scope in scopes:
                for kind in (HPA_KIND, SCALED_OBJECT_KIND):
                    self._list_kind(kind, scope, listing)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            raise _classified("list autoscalers", error) from error
        return listing

    async def list_autoscalers(self) -> Listing:
        return await asyncio.to_thread(self.list_blocking)

    # -- the executor's questions -------------------------------------------------------------

    def _verdict(self, target: WorkloadRef) -> Verdict:
        claimants = claims(self.list_blocking(target.namespace).autoscalers).get(target, ())
        if not claimants:
            return verdict((), mode="yield")
        adapter = self.adapters.get(target.kind)
        annotations: dict[str, str] = {}
        if adapter is not None:
            try:
                obj = self.http.get(adapter.path(target))
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
                raise _classified(f"read {target}", error) from error
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
        try:
            mode = mode_of(annotations)
        except ValueError as error:  # never steer on a typo
            found = verdict(claimants, mode="yield")
            return Verdict("yield", f"{found.reason}; {error}")
        return verdict(claimants, mode=mode, user_max=user_max_of(annotations))

    async def verdict(self, target: WorkloadRef) -> Verdict:
        """Whether another autoscaler targets `target`, and whether Tideshift yields or steers."""
        return await asyncio.to_thread(self._verdict, target)

    def _steer(self, autoscaler: Autoscaler, bounds: Bounds) -> None:
        prefix, plural = PATHS[autoscaler.kind]
        path = f"{prefix}/namespaces/{autoscaler.namespace}/{plural}/{autoscaler.name}"
        body = bounds_patch(autoscaler, bounds)
        try:
            self.http.json("PATCH", path, body=body, content_type=MERGE_PATCH)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            if status_of(error) == 404:
                raise KeyError(f"{autoscaler} not found") from error
            raise _classified(f"steer {autoscaler}", error) from error

    async def steer(self, autoscaler: Autoscaler, bounds: Bounds) -> None:
        """Write the autoscaler's bounds (never its target's replicas)."""
        await asyncio.to_thread(self._steer, autoscaler, bounds)


def _classified(what: str, error: BaseException) -> ClusterError:
    status = status_of(error)
    reason = getattr(error, "reason", None) or type(error).__name__
    message = f"{what}: " + (f"HTTP {status} {reason}" if status else str(reason))
    return ClusterError(message, transient=status is None or status in TRANSIENT, status=status)

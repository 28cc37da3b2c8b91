"""`tideshift run watcher`'s settings: which cluster, which namespaces and pods, how often it
relists, and where the snapshot goes. Decides nothing."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tideshift.events import SNAPSHOT_BUCKET
from tideshift.services.common.settings import ServiceSettings

# A Kubernetes namespace name (a DNS-1123 label): it becomes part of the API paths watched.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class WatcherSettings(ServiceSettings):
    """Watch Kubernetes nodes and pods; publish cluster events; keep the snapshot in NATS KV."""

    kubeconfig: str | None = Field(
        default=None,
        description="kubeconfig path; unset = $KUBECONFIG or ~/.kube/config, or in-cluster",
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context to use")
    namespace: str | None = Field(
        default=None, description="watch pods of this namespace only; unset = all namespaces"
    )
    namespaces: list[Annotated[str, Field(pattern=NAMESPACE_PATTERN)]] = Field(
        default_factory=list,
        description="watch these namespaces only, one watch each (with `namespace`: it too); "
        "empty = `namespace`, or all namespaces",
    )
    label_selector: str | None = Field(
        default=None, description="watch only pods matching this label selector"
    )
    resync_seconds: float = Field(
        default=300.0, gt=0, description="full relist period, seconds (publishes differences)"
    )
    skipped_events: bool = Field(
        default=True,
        description="record a Warning Event (TideshiftSkipped) on each target a plan skips",
    )
    other_autoscalers: bool = Field(
        default=True,
        description="look for HPAs and KEDA ScaledObjects targeting labelled workloads: "
        "Tideshift leaves their replicas to them (see the other-autoscalers guide)",
    )
    autoscalers_period_seconds: float = Field(
        default=15.0, gt=0, le=3600, description="how often HPAs and ScaledObjects are listed"
    )
    snapshot_bucket: str = Field(
        default=SNAPSHOT_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="NATS KV bucket holding the current cluster snapshot",
    )

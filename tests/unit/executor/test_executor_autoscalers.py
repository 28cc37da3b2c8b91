"""The executor beside another autoscaler (fakes of our ports; the real HPA controller is
tests/k8s/test_other_autoscalers_k8s.py): it yields, writing nothing and saying why, or it
steers the autoscaler's bounds and never writes replicas; and the adapter that lists them
skips what it cannot read (a missing or other-version CRD, a malformed object)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from tests.unit.executor.test_executor_admission import FakeRecords, FakeScales, FixedClock
from tests.unit.executor.test_executor_events import FakeEvents
from tideshift.events import ScaleCommand
from tideshift.services.cluster.adapters.autoscalers import KubernetesAutoscalers
from tideshift.services.cluster.adapters.targets import default_adapters
from tideshift.services.cluster.core.autoscalers import (
    FREE,
    HPA_KIND,
    LEFT_TO,
    Autoscaler,
    Bounds,
    Verdict,
    verdict,
)
from tideshift.services.cluster.port import ClusterError, ScaleState, WorkloadRef
from tideshift.services.executor.executor import (
    LEFT_TO_AUTOSCALER_REASON,
    STEERED_REASON,
    Executor,
    MemoryFightStore,
)

WEB = WorkloadRef("shop", "Deployment.apps", "web")
HPA = Autoscaler(HPA_KIND, "shop", "web", WEB, 2, 10)


@dataclass
class FakeAutoscalers:
    """Our OtherAutoscalers port: a fixed verdict; records every steer."""

    said: Verdict = FREE
    steered: list[tuple[Autoscaler, Bounds]] = field(default_factory=list)

    async def verdict(self, target: WorkloadRef) -> Verdict:
        return self.said

    async def steer(self, autoscaler: Autoscaler, bounds: Bounds) -> None:
        self.steered.append((autoscaler, bounds))
        self.said = verdict(
            (Autoscaler(HPA_KIND, "shop", "web", WEB, bounds.min_replicas, bounds.max_replicas),),
            mode="steer",
            user_max=self.said.user_max,
        )


def command(desired: int, n: int) -> ScaleCommand:
    return ScaleCommand(
        target=WEB,
        desired=desired,
        reason="forecast",
        plan_id=f"p{n}",
        issued_at=datetime(2026, 1, 1, 12, n, tzinfo=UTC),
        idempotency_key=f"k{n}",
    )


def executor(
    said: Verdict, **options: Any
) -> tuple[Executor, FakeScales, FakeAutoscalers, FakeEvents]:
    scales = FakeScales(ScaleState(WEB, replicas=3, role="serving"))
    gate, events = FakeAutoscalers(said), FakeEvents()
    made = Executor(
        scales,  # type: ignore[arg-type]
        FakeRecords(),  # type: ignore[arg-type]
        clock=FixedClock(1_000_000.0),
        events=events,
        autoscalers=gate,
        **options,
    )
    return made, scales, gate, events


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_yield_writes_nothing_says_why_and_counts() -> None:
    said = verdict((HPA,), mode="yield")
    made, scales, gate, events = executor(said, fights=MemoryFightStore())
    before = counter("tideshift_executor_yielded_commands_total")
    result = await made.handle(command(8, 1))
    assert (result.outcome, result.current) == ("rejected", 3)
    assert (
        result.message.startswith(LEFT_TO) and "HorizontalPodAutoscaler shop/web" in result.message
    )
    assert scales.writes == [] and gate.steered == []
    assert events.told == [(WEB, "Warning", LEFT_TO_AUTOSCALER_REASON, said.reason)]
    assert counter("tideshift_executor_yielded_commands_total") == before + 1
    # The plan wanting what is already there is no refusal.
    assert (await made.handle(command(3, 2))).outcome == "noop"
    # The autoscaler gone: written as usual.
    gate.said = FREE
    assert (await made.handle(command(8, 3))).outcome == "applied"
    assert scales.writes == [8]


async def test_steer_writes_the_bounds_never_replicas() -> None:
    made, scales, gate, events = executor(verdict((HPA,), mode="steer", user_max=12))
    before = counter("tideshift_executor_steered_total")
    result = await made.handle(command(7, 1))
    assert result.outcome == "applied"
    assert (result.previous, result.current) == (3, 3)  # replicas are the HPA's to move
    assert gate.steered == [(HPA, Bounds(7, 12))]
    assert "minReplicas 2 -> 7, maxReplicas 10 -> 12" in result.message
    assert scales.writes == []
    assert events.told[-1][1:3] == ("Normal", STEERED_REASON)
    assert counter("tideshift_executor_steered_total") == before + 1
    # Steered already: the same plan writes nothing again; a count equal to replicas still
    # steers (the minimum is what matters, not the count now).
    assert (await made.handle(command(7, 2))).outcome == "noop"
    assert (await made.handle(command(3, 3))).outcome == "applied"
    assert gate.steered[-1][1] == Bounds(3, 12)


async def test_steer_in_observe_mode_writes_nothing() -> None:
    made, scales, gate, events = executor(verdict((HPA,), mode="steer"), observe=True)
    result = await made.handle(command(7, 1))
    assert (result.outcome, result.dry_run) == ("would_scale", True)
    assert "would steer" in result.message and gate.steered == [] and scales.writes == []
    assert events.told[-1][1:3] == ("Normal", "TideshiftWouldScale")


class FakeHttp:
    """KubeHttp's GET and PATCH on canned answers: a path -> an object or an HTTP status."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.patches: list[tuple[str, Any]] = []
        self.gets: list[str] = []

    def get(self, path: str, *, query: Any = ()) -> dict[str, Any]:
        self.gets.append(path)
        answer = self.answers.get(path, 404)
        if isinstance(answer, int):
            raise ApiException(status=answer, reason="canned")
        return dict(answer)

    def json(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        assert method == "PATCH"
        self.patches.append((path, body))
        return self.get(path)


HPAS = "/apis/autoscaling/v2/namespaces/shop/horizontalpodautoscalers"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/shop/scaledobjects"
DEPLOYMENT = "/apis/apps/v1/namespaces/shop/deployments/web"


def hpa_object(name: str, target: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"scaleTargetRef": target, "minReplicas": 2, "maxReplicas": 10},
    }


@pytest.mark.parametrize("unserved", [404, 403])
def test_a_missing_crd_and_a_malformed_object_are_skipped(unserved: int) -> None:
    good = hpa_object("web", {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"})
    bad = hpa_object("broken", {"kind": "Deployment"})  # no name
    http = FakeHttp({HPAS: {"items": [bad, good]}, SCALED_OBJECTS: unserved})
    lister = KubernetesAutoscalers(http, namespaces=["shop"])  # type: ignore[arg-type]
    skipped = (
        REGISTRY.get_sample_value("tideshift_autoscalers_skipped_total", {"kind": HPA_KIND}) or 0.0
    )
    listing = lister.list_blocking()
    assert [a.name for a in listing.autoscalers] == ["web"]
    assert any("scaleTargetRef.name=None" in p for p in listing.problems)
    assert any(p.startswith("ScaledObject: not") for p in listing.problems)
    after = REGISTRY.get_sample_value("tideshift_autoscalers_skipped_total", {"kind": HPA_KIND})
    assert after == skipped + 1
    asked = len(http.gets)
    again = lister.list_blocking()  # the same bad object again: logged and counted once
    # The unserved kind is not asked for again within a minute; its problem still reported.
    assert http.gets[asked:] == [HPAS]
    assert any(p.startswith("ScaledObject: not") for p in again.problems)
    assert (
        REGISTRY.get_sample_value("tideshift_autoscalers_skipped_total", {"kind": HPA_KIND})
        == after
    )


def test_an_apiserver_that_fails_is_a_transient_cluster_error() -> None:
    lister = KubernetesAutoscalers(FakeHttp({HPAS: 503}), namespaces=["shop"])  # type: ignore[arg-type]
    with pytest.raises(ClusterError) as caught:
        lister.list_blocking()
    assert caught.value.transient


async def test_the_verdict_reads_the_workloads_mode_and_max_and_steer_patches_bounds() -> None:
    good = hpa_object("web", {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"})
    annotations = {"tideshift.io/other-autoscaler": "steer", "tideshift.io/max-replicas": "9"}
    http = FakeHttp(
        {
            HPAS: {"items": [good]},
            SCALED_OBJECTS: {"items": []},
            DEPLOYMENT: {"metadata": {"annotations": annotations}},
            f"{HPAS}/web": good,
        }
    )
    lister = KubernetesAutoscalers(
        http,  # type: ignore[arg-type]
        namespaces=["shop"],
        adapters=default_adapters(),
    )
    said = await lister.verdict(WEB)
    assert (said.action, said.user_max) == ("steer", 9)
    assert said.autoscaler is not None
    await lister.steer(said.autoscaler, Bounds(5, 9))
    assert http.patches == [(f"{HPAS}/web", {"spec": {"minReplicas": 5, "maxReplicas": 9}})]
    # A mistyped mode never steers.
    http.answers[DEPLOYMENT] = {"metadata": {"annotations": {"tideshift.io/other-autoscaler": "x"}}}
    said = await lister.verdict(WEB)
    assert said.action == "yield" and "'x'" in said.reason
    # Nobody targets another workload.
    assert (await lister.verdict(WorkloadRef("shop", "Deployment.apps", "api"))).action == "free"

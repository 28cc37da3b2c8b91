"""The rules for a workload another autoscaler (an HPA, a KEDA ScaledObject) also scales:
what each targets, which count as one, when Tideshift yields or steers, and the bounds it
writes (services/cluster/core/autoscalers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tideshift.services.cluster.core.autoscalers import (
    HPA_KIND,
    LEFT_TO,
    MODE_ANNOTATION,
    SCALED_OBJECT_KIND,
    Autoscaler,
    BadAutoscaler,
    Bounds,
    autoscaler_from_object,
    bounds_patch,
    claims,
    held_reason,
    mode_of,
    steer_message,
    steered_bounds,
    user_max_of,
    verdict,
)
from tideshift.services.cluster.port import WorkloadRef

WEB = WorkloadRef("shop", "Deployment.apps", "web")


def hpa(
    name: str = "web", *, ref: Any = None, owner: str | None = None, **spec: Any
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "shop", "resourceVersion": "7"}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": owner, "uid": "u"}
        ]
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"} if ref is None else ref
    return {"metadata": metadata, "spec": {"scaleTargetRef": target, "maxReplicas": 10, **spec}}


def scaled_object(name: str = "web-so", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"scaleTargetRef": {"name": "web"}, **spec},
    }


def test_an_hpa_names_its_target_and_bounds() -> None:
    found = autoscaler_from_object(hpa(minReplicas=2), HPA_KIND)
    assert found.target == WEB
    assert (found.min_replicas, found.max_replicas, found.made_by) == (2, 10, None)
    assert str(found) == "HorizontalPodAutoscaler shop/web"
    # minReplicas left out is 1 (the API's default); a StatefulSet is named by its group.
    statefulset = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}
    found = autoscaler_from_object(hpa(ref=statefulset), HPA_KIND)
    assert (found.target, found.min_replicas) == (
        WorkloadRef("shop", "StatefulSet.apps", "db"),
        1,
    )


def test_a_scaled_object_defaults_to_a_deployment_and_kedas_bounds() -> None:
    found = autoscaler_from_object(scaled_object(), SCALED_OBJECT_KIND)
    assert found.target == WEB
    assert (found.min_replicas, found.max_replicas) == (0, 100)
    found = autoscaler_from_object(
        scaled_object(minReplicaCount=3, maxReplicaCount=9), SCALED_OBJECT_KIND
    )
    assert (found.min_replicas, found.max_replicas) == (3, 9)


@pytest.mark.parametrize(
    ("obj", "names"),
    [
        (hpa(ref={"kind": "Deployment"}), "scaleTargetRef.name=None: expected a string"),
        (hpa(ref="web"), "scaleTargetRef: expected an object"),
        (hpa(ref={"name": "web", "kind": ""}), "scaleTargetRef.kind=''"),
        (hpa(ref={"name": "web", "kind": "Deployment", "apiVersion": 1}), "apiVersion=1"),
        (hpa(maxReplicas="ten"), "maxReplicas='ten': expected a whole number >= 1"),
        (hpa(maxReplicas=None), "maxReplicas=None"),
        (hpa(minReplicas=-1), "minReplicas=-1"),
        ({"metadata": {"name": "x", "namespace": "shop"}, "spec": []}, "spec: expected"),
        ({"metadata": {"namespace": "shop"}, "spec": {}}, "metadata.name"),
    ],
)
def test_an_unreadable_autoscaler_is_refused_naming_the_field(obj: Any, names: str) -> None:
    with pytest.raises(BadAutoscaler) as caught:
        autoscaler_from_object(obj, HPA_KIND)
    assert names in str(caught.value)


def test_kedas_own_hpa_belongs_to_its_scaled_object() -> None:
    so = autoscaler_from_object(scaled_object(), SCALED_OBJECT_KIND)
    made = autoscaler_from_object(hpa("keda-hpa-web-so", owner="web-so"), HPA_KIND)
    assert made.made_by == "web-so"
    assert claims([so, made]) == {WEB: (so,)}
    # Its ScaledObject unread (KEDA's CRD not served here): the HPA still writes replicas.
    assert claims([made]) == {WEB: (made,)}


def test_claims_group_by_target_in_a_stable_order() -> None:
    one = autoscaler_from_object(hpa("b"), HPA_KIND)
    two = autoscaler_from_object(hpa("a"), HPA_KIND)
    other = autoscaler_from_object(hpa("c", ref={"kind": "Deployment", "name": "api"}), HPA_KIND)
    table = claims([one, other, two])
    assert table[WEB] == (two, one)
    assert table[WorkloadRef("shop", "Deployment", "api")] == (other,)  # no apiVersion: core


def test_yield_by_default_and_say_why() -> None:
    found = autoscaler_from_object(hpa(), HPA_KIND)
    assert verdict((), mode="yield").action == "free"
    said = verdict((found,), mode="yield")
    assert said.action == "yield"
    assert said.reason.startswith(f"{LEFT_TO} HorizontalPodAutoscaler shop/web")
    assert MODE_ANNOTATION in said.reason  # how to let Tideshift steer instead


def test_steer_one_autoscaler_never_two() -> None:
    one = autoscaler_from_object(hpa("a"), HPA_KIND)
    two = autoscaler_from_object(scaled_object(), SCALED_OBJECT_KIND)
    said = verdict((one,), mode="steer", user_max=8)
    assert (said.action, said.autoscaler, said.user_max) == ("steer", one, 8)
    said = verdict((one, two), mode="steer")
    assert said.action == "yield" and "not two" in said.reason


@pytest.mark.parametrize(
    ("annotations", "mode"),
    [({}, "yield"), ({MODE_ANNOTATION: "Steer "}, "steer"), ({MODE_ANNOTATION: "yield"}, "yield")],
)
def test_mode_of_the_annotation(annotations: dict[str, str], mode: str) -> None:
    assert mode_of(annotations) == mode


def test_a_mistyped_mode_names_the_annotation_and_yields() -> None:
    with pytest.raises(ValueError, match=r"tideshift.io/other-autoscaler='stear': expected"):
        mode_of({MODE_ANNOTATION: "stear"})
    found = autoscaler_from_object(hpa(), HPA_KIND)
    reason = held_reason((found,), {MODE_ANNOTATION: "stear"}, serving=True)
    assert reason.startswith(LEFT_TO) and "'stear'" in reason


def test_held_reason_is_empty_only_when_free_or_steered() -> None:
    found = autoscaler_from_object(hpa(), HPA_KIND)
    steer = {MODE_ANNOTATION: "steer"}
    assert held_reason((), {}, serving=True) == ""
    assert held_reason((found,), steer, serving=True) == ""
    assert held_reason((found,), {}, serving=True).startswith(LEFT_TO)
    # A training job is never steered: its size is not a forecast's.
    assert held_reason((found,), steer, serving=False).startswith(LEFT_TO)


def autoscaler(kind: Any = HPA_KIND, low: int = 1, high: int = 10) -> Autoscaler:
    return Autoscaler(kind, "shop", "web", WEB, low, high)


@pytest.mark.parametrize(
    ("kind", "needed", "user_max", "bounds"),
    [
        (HPA_KIND, 6, None, Bounds(6, 10)),  # the forecast's need; the HPA's own max stays
        (HPA_KIND, 14, None, Bounds(10, 10)),  # never above the max (no annotation: the HPA's)
        (HPA_KIND, 14, 20, Bounds(14, 20)),  # tideshift.io/max-replicas is the user's max
        (HPA_KIND, 30, 20, Bounds(20, 20)),
        (HPA_KIND, 0, None, Bounds(1, 10)),  # an HPA's minimum is 1 (0 needs a feature gate)
        (SCALED_OBJECT_KIND, 0, None, Bounds(0, 10)),  # KEDA scales to zero itself
    ],
)
def test_steered_bounds(kind: Any, needed: int, user_max: int | None, bounds: Bounds) -> None:
    assert steered_bounds(autoscaler(kind), needed=needed, user_max=user_max) == bounds


def test_the_patch_writes_only_the_bounds() -> None:
    assert bounds_patch(autoscaler(), Bounds(4, 10)) == {
        "spec": {"minReplicas": 4, "maxReplicas": 10}
    }
    assert bounds_patch(autoscaler(SCALED_OBJECT_KIND), Bounds(0, 5)) == {
        "spec": {"minReplicaCount": 0, "maxReplicaCount": 5}
    }
    words = steer_message(autoscaler(low=2), Bounds(5, 12))
    assert words.startswith(
        "HorizontalPodAutoscaler shop/web: minReplicas 2 -> 5, maxReplicas 10 -> 12"
    )


@pytest.mark.parametrize(
    ("raw", "value"), [(None, None), ("12", 12), (" 3 ", 3), ("0", None), ("x", None), ("-2", None)]
)
def test_user_max(raw: str | None, value: int | None) -> None:
    annotations = {} if raw is None else {"tideshift.io/max-replicas": raw}
    assert user_max_of(annotations) == value

"""Other autoscalers on a workload Tideshift manages: which HorizontalPodAutoscaler
(autoscaling/v2) or KEDA ScaledObject (keda.sh/v1alpha1) targets it, and what Tideshift does
about it. Pure: objects in, decisions out; no I/O, no clock.

Two writers of one `replicas` undo each other for ever, so by default Tideshift *yields*: it
writes nothing to a workload another autoscaler targets, and says why (the reason is the plan's,
the watcher's Warning Event's and the executor's). With the workload's annotation
`tideshift.io/other-autoscaler: "steer"` it *steers* instead: it writes the autoscaler's
bounds from its forecast and leaves `replicas` to the autoscaler:

* an HPA's `minReplicas` becomes what the forecast over the lead time needs (the plan's
  count; at least 1: 0 needs the HPAScaleToZero feature gate), a ScaledObject's
  `minReplicaCount` likewise (0 allowed: KEDA scales to zero itself);
* the maximum is the user's: `tideshift.io/max-replicas` when the workload carries it, else the
  autoscaler's own maximum, which Tideshift then never changes; the minimum never exceeds it.

KEDA runs a ScaledObject through an HPA it creates and owns (`keda-hpa-<name>`); that HPA is the
ScaledObject's, not a second autoscaler: steering writes the ScaledObject, never KEDA's HPA
(KEDA would put it back).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tideshift.events import ServingPolicy
from tideshift.events.models import annotation_of
from tideshift.services.cluster.core.kinds import qualified_kind
from tideshift.services.cluster.port import WorkloadRef

AutoscalerKind = Literal["HorizontalPodAutoscaler", "ScaledObject"]
HPA_KIND: AutoscalerKind = "HorizontalPodAutoscaler"
SCALED_OBJECT_KIND: AutoscalerKind = "ScaledObject"
HPA_API_VERSION = "autoscaling/v2"
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_GROUP = "keda.sh"
# KEDA's defaults for a ScaledObject that leaves its bounds out.
KEDA_DEFAULT_MIN = 0
KEDA_DEFAULT_MAX = 100

Mode = Literal["yield", "steer"]
MODES: tuple[str, ...] = get_args(Mode)
MODE_ANNOTATION = annotation_of(ServingPolicy, "other_autoscaler")
MAX_ANNOTATION = annotation_of(ServingPolicy, "max_replicas")
LEFT_TO = "left to"  # how a yielded target's reason begins (plan, Event, result)


class BadAutoscaler(ValueError):
    """An HPA or ScaledObject Tideshift cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """Another autoscaler, as far as Tideshift reads it."""

    kind: AutoscalerKind
    namespace: str
    name: str
    target: WorkloadRef  # the workload whose replicas it writes
    min_replicas: int
    max_replicas: int
    made_by: str | None = None  # an HPA KEDA made: the name of its ScaledObject
    resource_version: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Bounds:
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """`free`: no other autoscaler, Tideshift writes replicas; `yield`: it writes nothing
    (`reason` says why); `steer`: it writes `autoscaler`'s bounds, never replicas."""

    action: Literal["free", "yield", "steer"]
    reason: str = ""
    autoscaler: Autoscaler | None = None
    user_max: int | None = None  # tideshift.io/max-replicas, when the workload carries it


FREE = Verdict("free")


def _integer(value: Any, field: str, *, default: int | None, low: int) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadAutoscaler(f"{field}={value!r}: expected a whole number >= {low}")
    return value


def autoscaler_from_object(obj: Mapping[str, Any], kind: AutoscalerKind) -> Autoscaler:
    """An HPA (autoscaling/v2) or a ScaledObject as Tideshift reads it; BadAutoscaler names
    the field that cannot be read (a scaleTargetRef without a name, a bound not a number)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        raise BadAutoscaler("metadata.name: expected the object's name")
    namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
    if not namespace:
        raise BadAutoscaler(f"{kind} {name}: metadata.namespace: expected its namespace")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise BadAutoscaler(f"{kind} {namespace}/{name}: spec: expected an object")
    where = f"{kind} {namespace}/{name}: spec"
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, Mapping):
        raise BadAutoscaler(f"{where}.scaleTargetRef: expected an object naming its target")
    target_name, target_kind = ref.get("name"), ref.get("kind")
    api_version = ref.get("apiVersion")
    if kind == SCALED_OBJECT_KIND:  # KEDA's defaults: a Deployment
        target_kind = target_kind or "Deployment"
        api_version = api_version or "apps/v1"
    elif api_version is None:  # optional in an HPA: the core group
        api_version = ""
    for field, value in (("name", target_name), ("kind", target_kind)):
        if not isinstance(value, str) or not value:
            raise BadAutoscaler(f"{where}.scaleTargetRef.{field}={value!r}: expected a string")
    if not isinstance(api_version, str):
        raise BadAutoscaler(
            f"{where}.scaleTargetRef.apiVersion={api_version!r}: expected e.g. apps/v1"
        )
    target = WorkloadRef(namespace, qualified_kind(str(target_kind), api_version), str(target_name))
    if kind == HPA_KIND:
        low = _integer(spec.get("minReplicas"), f"{where}.minReplicas", default=1, low=0)
        high = _integer(spec.get("maxReplicas"), f"{where}.maxReplicas", default=None, low=1)
    else:
        low = _integer(
            spec.get("minReplicaCount"), f"{where}.minReplicaCount", default=KEDA_DEFAULT_MIN, low=0
        )
        high = _integer(
            spec.get("maxReplicaCount"), f"{where}.maxReplicaCount", default=KEDA_DEFAULT_MAX, low=1
        )
    return Autoscaler(
        kind=kind,
        namespace=namespace,
        name=name,
        target=target,
        min_replicas=low,
        max_replicas=high,
        made_by=_scaled_object_owner(metadata) if kind == HPA_KIND else None,
        resource_version=str(metadata.get("resourceVersion") or ""),
    )


def _scaled_object_owner(metadata: Mapping[str, Any]) -> str | None:
    for owner in metadata.get("ownerReferences") or ():
        if not isinstance(owner, Mapping):
            continue
        group = str(owner.get("apiVersion") or "").partition("/")[0]
        if owner.get("kind") == SCALED_OBJECT_KIND and group == KEDA_GROUP and owner.get("name"):
            return str(owner["name"])
    return None


def claims(autoscalers: Iterable[Autoscaler]) -> dict[WorkloadRef, tuple[Autoscaler, ...]]:
    """Each targeted workload's autoscalers, by name. An HPA KEDA made for a ScaledObject that
    is listed too is left out: it is that ScaledObject's way of scaling, not another writer."""
    found = list(autoscalers)
    scaled_objects = {(a.namespace, a.name) for a in found if a.kind == SCALED_OBJECT_KIND}
    by_target: dict[WorkloadRef, list[Autoscaler]] = {}
    for autoscaler in found:
        if autoscaler.made_by is not None and (
            (autoscaler.namespace, autoscaler.made_by) in scaled_objects
        ):
            continue
        by_target.setdefault(autoscaler.target, []).append(autoscaler)
    return {
        target: tuple(sorted(found, key=lambda a: (a.kind, a.name)))
        for target, found in by_target.items()
    }


def mode_of(annotations: Mapping[str, str]) -> Mode:
    """The workload's `tideshift.io/other-autoscaler` (default "yield"); ValueError naming the
    annotation when it is neither."""
    value = annotations.get(MODE_ANNOTATION, "yield").strip().lower()
    if value == "steer":
        return "steer"
    if value == "yield":
        return "yield"
    raw = annotations[MODE_ANNOTATION]
    raise ValueError(f'{MODE_ANNOTATION}={raw!r}: expected "yield" or "steer"')


def _names(claimants: Sequence[Autoscaler]) -> str:
    return " and ".join(str(a) for a in claimants)


def verdict(claimants: Sequence[Autoscaler], *, mode: Mode, user_max: int | None = None) -> Verdict:
    """What Tideshift does with a workload these autoscalers target."""
    if not claimants:
        return FREE
    names = _names(claimants)
    if mode == "steer" and len(claimants) == 1:
        only = claimants[0]
        reason = f"steering {only}'s bounds from the forecast; its replicas are its own"
        return Verdict("steer", reason, only, user_max)
    if mode == "steer":
        reason = (
            f"{LEFT_TO} {names}: they write its replicas; Tideshift steers one autoscaler's "
            "bounds, not two, so it writes nothing"
        )
        return Verdict("yield", reason)
    reason = (
        f"{LEFT_TO} {names}: it writes the replicas, so Tideshift writes nothing "
        f'({MODE_ANNOTATION}: "steer" lets Tideshift set its bounds from the forecast instead)'
    )
    return Verdict("yield", reason)


def steered_bounds(autoscaler: Autoscaler, *, needed: int, user_max: int | None) -> Bounds:
    """The bounds to write for a plan that needs `needed` replicas (see the module's rules)."""
    high = user_max if user_max is not None else autoscaler.max_replicas
    high = max(high, 1)
    floor = 1 if autoscaler.kind == HPA_KIND else 0
    low = min(max(needed, floor), high)
    return Bounds(low, high)


def bounds_patch(autoscaler: Autoscaler, bounds: Bounds) -> dict[str, Any]:
    """The JSON merge patch that writes `bounds` (an HPA's min/maxReplicas, a ScaledObject's
    min/maxReplicaCount) and nothing else."""
    if autoscaler.kind == HPA_KIND:
        spec = {"minReplicas": bounds.min_replicas, "maxReplicas": bounds.max_replicas}
    else:
        spec = {"minReplicaCount": bounds.min_replicas, "maxReplicaCount": bounds.max_replicas}
    return {"spec": spec}


def steer_message(autoscaler: Autoscaler, bounds: Bounds) -> str:
    """`HorizontalPodAutoscaler shop/web: minReplicas 2 -> 5, maxReplicas 10`."""
    low, high = (
        ("minReplicas", "maxReplicas")
        if autoscaler.kind == HPA_KIND
        else ("minReplicaCount", "maxReplicaCount")
    )
    was_max = autoscaler.max_replicas
    max_words = (
        f"{high} {bounds.max_replicas}"
        if was_max == bounds.max_replicas
        else f"{high} {was_max} -> {bounds.max_replicas}"
    )
    return (
        f"{autoscaler}: {low} {autoscaler.min_replicas} -> {bounds.min_replicas}, {max_words} "
        "(its replicas are its own)"
    )


def held_reason(
    claimants: Sequence[Autoscaler], annotations: Mapping[str, str], *, serving: bool
) -> str:
    """Why the plan leaves this workload alone, or "" (no autoscaler, or one Tideshift steers).
    Only a serving workload may be steered; an unreadable mode yields (never steer on a typo)."""
    if not claimants:
        return ""
    try:
        mode: Mode = mode_of(annotations) if serving else "yield"
    except ValueError as error:
        return f"{verdict(claimants, mode='yield').reason}; {error}"
    return verdict(claimants, mode=mode).reason if mode == "yield" or len(claimants) > 1 else ""


def user_max_of(annotations: Mapping[str, str]) -> int | None:
    """`tideshift.io/max-replicas` as a whole number >= 1, or None (absent or unreadable)."""
    raw = annotations.get(MAX_ANNOTATION)
    if raw is None or not raw.strip().isdigit() or int(raw) < 1:
        return None
    return int(raw)

"""The event contract: codec round trips, subject tokens, rejection reasons, AsyncAPI."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tideshift import events
from tideshift.events.asyncapi import asyncapi_document
from tideshift.events.codec import EVENT_MODELS
from tideshift.events.models import KueueQuotaLent, KueueQuotaStep, ServingNeed

# Valid Kubernetes names: DNS-1123 subdomains (lower-case alphanumerics, '-' and '.').
label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
kube_name = st.lists(label, min_size=1, max_size=4).map(".".join)
namespaces = label  # a namespace is one DNS label (at most 63 characters)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
counts = st.integers(min_value=0, max_value=10_000)
text = st.text(max_size=40)
finite = st.floats(min_value=0, max_value=1e12, allow_nan=False)

resources = st.builds(
    events.Resources,
    cpu=st.floats(min_value=0, max_value=1e9),
    memory=finite,
    gpu=st.integers(min_value=0, max_value=16),
)
workload = st.builds(
    events.WorkloadRef,
    kind=st.sampled_from(
        ["Deployment", "StatefulSet.apps", "Job", "Job.batch.volcano.sh", "PyTorchJob"]
    ),
    namespace=namespaces,
    name=kube_name,
)


@st.composite
def forecast_point(draw: st.DrawFn) -> events.ForecastPoint:
    q = sorted(draw(st.lists(finite, min_size=4, max_size=4)))
    return events.ForecastPoint(
        at=draw(times), point=draw(finite), q50=q[0], q90=q[1], q95=q[2], q99=q[3]
    )


@st.composite
def shard_task(draw: st.DrawFn) -> events.ShardTask:
    shards = draw(st.integers(min_value=1, max_value=1000))
    return events.ShardTask(
        job=draw(kube_name),
        epoch=draw(counts),
        shard=draw(st.integers(min_value=0, max_value=shards - 1)),
        shards=shards,
        issued_at=draw(times),
    )


change = st.sampled_from(["added", "modified", "deleted"])
STRATEGIES: dict[type[events.EventData], st.SearchStrategy[events.EventData]] = {
    events.NodeChanged: st.builds(
        events.NodeChanged,
        change=change,
        name=kube_name,
        allocatable=resources,
        labels=st.dictionaries(kube_name, text, max_size=3),
        observed_at=times,
    ),
    events.PodChanged: st.builds(
        events.PodChanged,
        change=change,
        namespace=namespaces,
        name=kube_name,
        phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
        node=st.none() | kube_name,
        priority=st.integers(min_value=-(2**31), max_value=2**31 - 1),
        owner=st.none() | workload,
        role=st.sampled_from(["serving", "training", "other"]),
        companion=st.booleans(),
        requests=resources,
        observed_at=times,
    ),
    events.ForecastIssued: st.builds(
        events.ForecastIssued,
        workload=workload,
        issued_at=times,
        step_seconds=st.floats(min_value=1, max_value=3600),
        model=st.sampled_from(["tideshift", "holt_winters"]),
        points=st.lists(forecast_point(), min_size=1, max_size=5).map(tuple),
        stale=st.booleans(),
    ),
    events.DemandObserved: st.builds(
        events.DemandObserved,
        workload=workload,
        rps=st.floats(min_value=0, max_value=1e9),
        observed_at=times,
    ),
    events.ScaleCommand: st.builds(
        events.ScaleCommand,
        target=workload,
        desired=counts,
        reason=text.filter(bool),
        plan_id=label,
        issued_at=times,
        idempotency_key=label,
    ),
    events.ScaleResult: st.builds(
        events.ScaleResult,
        target=workload,
        idempotency_key=label,
        outcome=st.sampled_from(["applied", "noop", "rejected", "failed"]),
        previous=st.none() | counts,
        current=st.none() | counts,
        desired=counts,
        message=text,
        executed_at=times,
    ),
    events.PlanDecided: st.builds(
        events.PlanDecided,
        plan_id=label,
        policy=label,
        decided_at=times,
        targets=st.lists(
            st.builds(
                events.TargetDecision, target=workload, current=counts, desired=counts, reason=text
            ),
            max_size=3,
        ).map(tuple),
        infeasible=st.lists(text, max_size=2).map(tuple),
    ),
    events.PlannerStatus: st.builds(
        events.PlannerStatus,
        planner=label,
        leader=st.booleans(),
        mode=st.sampled_from(["normal", "degraded", "passive"]),
        reasons=st.lists(text, max_size=2).map(tuple),
        at=times,
    ),
    ServingNeed: st.builds(
        ServingNeed,
        plan_id=label,
        policy=label,
        decided_at=times,
        capacity=resources,
        reserved=resources,
        expected=resources,
        other=resources,
    ),
    KueueQuotaLent: st.builds(
        KueueQuotaLent,
        plan_id=label,
        executor=label,
        at=times,
        queues=st.lists(
            st.builds(
                KueueQuotaStep,
                queue=label,
                cpu=st.none() | st.floats(min_value=0, max_value=1e6),
                changed=st.booleans(),
                reason=text,
                error=st.booleans(),
                deactivated=st.lists(kube_name, max_size=2).map(tuple),
            ),
            max_size=3,
        ).map(tuple),
    ),
    events.ShardTask: shard_task(),
    events.JobProgress: st.builds(
        events.JobProgress,
        job=kube_name,
        state=st.sampled_from(["running", "finished"]),
        epoch=counts,
        epochs=st.none() | st.integers(min_value=1, max_value=100),
        shards=st.integers(min_value=1, max_value=1000),
        applied_in_epoch=counts,
        applied_total=counts,
        in_flight=counts,
        redelivered=counts,
        trainers=counts,
        logloss=st.none() | st.floats(min_value=0, max_value=10),
        at=times,
    ),
    events.TrainerMembership: st.builds(
        events.TrainerMembership,
        job=kube_name,
        trainer=label,
        change=st.sampled_from(["joined", "left", "crashed"]),
        reason=text,
        at=times,
    ),
    events.DeadLetter: st.builds(
        events.DeadLetter,
        consumer=label,
        original_subject=text,
        reason=text,
        payload=text,
        payload_bytes=counts,
        received_at=times,
    ),
    events.WorkloadChanged: st.one_of(
        st.builds(
            events.WorkloadChanged,
            change=change,
            workload=workload,
            role=st.just("serving"),
            replicas=counts,
            ready_replicas=counts,
            requests=resources,
            serving=st.builds(
                events.ServingPolicy,
                capacity_rps=st.floats(min_value=0.1, max_value=1e6),
                quantile=st.floats(min_value=0.5, max_value=0.99),
                demand_query=text,
            ),
            paused=st.booleans(),
            observed_at=times,
        ),
        st.builds(
            events.WorkloadChanged,
            change=change,
            workload=workload,
            role=st.just("training"),
            replicas=counts,
            min_replicas=counts,
            max_replicas=st.none() | counts,
            requests=resources,
            training=st.builds(
                events.TrainingPolicy,
                gang_min=st.none() | st.integers(min_value=1, max_value=64),
                priority=st.integers(min_value=-100, max_value=100),
                scale_task=label,
            ),
            observed_at=times,
        ),
    ),
}


def test_every_registered_model_has_a_strategy_and_a_subject() -> None:
    assert set(STRATEGIES) == set(EVENT_MODELS.values())
    assert {subject.model for subject in events.ALL_SUBJECTS} == set(EVENT_MODELS.values())


@pytest.mark.parametrize("model", list(STRATEGIES), ids=lambda m: m.__name__)
@given(data=st.data())
def test_codec_round_trips_every_event(model: type[events.EventData], data: st.DataObject) -> None:
    original = data.draw(STRATEGIES[model])
    raw = events.encode(original, source="test", subject="tideshift.v1.x")
    envelope = events.decode(raw, model)
    assert envelope.data == original
    assert envelope.type == model.event_type()
    body = json.loads(raw)
    assert body["specversion"] == "1.0"
    assert body["datacontenttype"] == "application/json"


@given(name=kube_name)
def test_tokens_round_trip_kubernetes_names(name: str) -> None:
    token = events.encode_token(name)
    assert "." not in token and "*" not in token and ">" not in token and "/" not in token
    assert events.decode_token(token) == name


@given(value=st.text())
def test_tokens_round_trip_any_string(value: str) -> None:
    token = events.encode_token(value)
    assert token and all(c.isascii() and (c.isalnum() or c in "-_") for c in token)
    assert events.decode_token(token) == value


@given(namespace=namespaces, kind=st.sampled_from(["Deployment", "Job"]), name=kube_name)
def test_subjects_parse_back_to_their_parameters(namespace: str, kind: str, name: str) -> None:
    bound = events.SCALE_COMMAND.at(namespace=namespace, kind=kind, name=name)
    assert bound.value.startswith("tideshift.v1.scale.command.")
    assert len(bound.value.split(".")) == 7
    assert events.SCALE_COMMAND.parse(bound.value) == {
        "namespace": namespace,
        "kind": kind,
        "name": name,
    }


def test_subject_helpers() -> None:
    wildcard = events.POD_CHANGED.filter(namespace="shop")
    assert wildcard.value == "tideshift.v1.cluster.pod.shop.*"
    assert wildcard.is_wildcard
    assert wildcard.mqtt_topic == "tideshift/v1/cluster/pod/shop/+"
    assert events.mqtt_topic_filter("tideshift.v1.>") == "tideshift/v1/#"
    with pytest.raises(ValueError, match="missing"):
        events.POD_CHANGED.at(namespace="shop")
    with pytest.raises(ValueError, match="unknown"):
        events.POD_CHANGED.filter(color="red")
    with pytest.raises(ValueError, match="does not match"):
        events.POD_CHANGED.parse("tideshift.v1.cluster.node.a")


NOW = datetime(2026, 1, 1, tzinfo=UTC)
VALID_COMMAND = events.ScaleCommand(
    target=events.WorkloadRef(kind="Deployment", namespace="shop", name="web"),
    desired=3,
    reason="forecast",
    plan_id="p1",
    issued_at=NOW,
    idempotency_key="k1",
)


def _with(**changes: object) -> bytes:
    body = json.loads(events.encode(VALID_COMMAND, source="t"))
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("raw", "kind", "fragment"),
    [
        (b"\xff\xfe not json", "not_utf8", "not UTF-8"),
        (b"definitely not json", "not_json", "not JSON"),
        (b"[1, 2]", "not_cloudevent", "not an object"),
        (b'{"id": "1"}', "not_cloudevent", "missing specversion"),
        (_with(specversion="0.3"), "not_cloudevent", "specversion"),
        (_with(type="io.tideshift.nothing.v1"), "unknown_type", "unknown event type"),
        (_with(type="io.tideshift.scale.command.v9"), "unknown_type", "schema version v9"),
        (_with(data={"desired": -1}), "invalid", "failed validation at data."),
        (_with(time="yesterday"), "not_cloudevent", "RFC 3339"),
        (b"{" + b" " * 2000 + b"}", "too_large", "exceeds limit 1000"),
    ],
)
def test_decode_rejects_bad_input_with_a_reason(raw: bytes, kind: str, fragment: str) -> None:
    with pytest.raises(events.EventRejected) as caught:
        events.decode(raw, max_bytes=1000)
    assert caught.value.kind == kind
    assert fragment in caught.value.reason


def test_decode_rejects_an_unexpected_type() -> None:
    progress = events.TrainerMembership(job="j", trainer="t", change="joined", at=NOW)
    with pytest.raises(events.EventRejected, match="was expected"):
        events.decode(events.encode(progress, source="t"), events.ScaleCommand)


def test_models_are_frozen_and_strict() -> None:
    with pytest.raises(ValueError, match="Unexpected keyword argument"):
        events.WorkloadRef(kind="Job", namespace="a", name="b", colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="Extra inputs"):
        events.ScaleCommand.model_validate({**VALID_COMMAND.model_dump(), "colour": "red"})
    with pytest.raises(ValueError, match="frozen"):
        VALID_COMMAND.desired = 4  # type: ignore[misc]
    with pytest.raises(ValueError, match="q50 <= q90"):
        events.ForecastPoint(at=NOW, point=1, q50=3, q90=2, q95=4, q99=5)
    with pytest.raises(ValueError, match="out of range"):
        events.ShardTask(job="j", epoch=0, shard=4, shards=4, issued_at=NOW)
    with pytest.raises(ValueError, match="timezone"):
        events.ScaleCommand.model_validate(
            VALID_COMMAND.model_dump() | {"issued_at": NOW.replace(tzinfo=None) + timedelta(0)}
        )


@pytest.mark.parametrize(
    ("rps", "fragment"),
    [(-1.0, "greater than or equal to 0"), (math.nan, "finite"), (math.inf, "finite")],
)
def test_observed_demand_is_finite_and_non_negative(rps: float, fragment: str) -> None:
    web = events.WorkloadRef(kind="Deployment", namespace="a", name="web")
    with pytest.raises(ValueError, match=fragment):
        events.DemandObserved(workload=web, rps=rps, observed_at=NOW)


def test_asyncapi_document_has_one_channel_per_subject_with_payload_schema() -> None:
    document = asyncapi_document()
    assert document["asyncapi"].startswith("3.")
    channels = document["channels"]
    assert len(channels) == len(events.ALL_SUBJECTS)
    addresses = {channel["address"] for channel in channels.values()}
    assert addresses == {subject.pattern for subject in events.ALL_SUBJECTS}
    command = channels["scale_command"]
    payload = command["messages"]["scale_command"]["payload"]
    assert payload["properties"]["type"]["const"] == "io.tideshift.scale.command.v1"
    assert "desired" in payload["properties"]["data"]["properties"]
    assert set(command["parameters"]) == {"namespace", "kind", "name"}
    json.dumps(document)  # serialisable as the CLI prints it


def test_a_batch_opt_in_is_optional_in_the_contract_and_lends_no_gpus() -> None:
    ctr = events.WorkloadRef(kind="PyTorchJob", namespace="ml", name="nightly")
    batch = events.WorkloadChanged(
        change="added",
        workload=ctr,
        role="training",
        replicas=2,
        requests=events.Resources(cpu=1.0),
        training=events.TrainingPolicy(batch=True),
        observed_at=NOW,
    )
    raw = events.encode(batch, source="t")
    assert events.decode(raw, events.WorkloadChanged).data == batch
    # A producer that predates the field: its announcement decodes as not batch.
    body = json.loads(raw)
    del body["data"]["training"]["batch"]
    older = events.decode(json.dumps(body).encode(), events.WorkloadChanged).data
    assert older.training is not None and not older.training.batch
    with pytest.raises(ValueError, match="GPUs are not lent"):
        events.WorkloadChanged.model_validate(
            batch.model_dump() | {"requests": events.Resources(cpu=1.0, gpu=1)}
        )
    schema = asyncapi_document()["components"]["schemas"]["TrainingPolicy"]
    assert schema["properties"]["batch"]["default"] is False
    assert "batch" not in schema.get("required", [])


def _workload_changed(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "change": "added",
        "workload": {"kind": "Deployment", "namespace": "shop", "name": "web"},
        "role": "serving",
        "replicas": 1,
        "requests": {"cpu": 1.0},
        "serving": {"capacity_rps": 10.0},
        "observed_at": "2026-01-01T00:00:00Z",
    }
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"serving": {"capacity_rps": 5e-324}}, "serving.capacity_rps: Input should be greater"),
        ({"serving": {"capacity_rps": 5e-324}}, "0.001"),
        ({"replicas": 2**31}, "replicas: Input should be less than or equal to 2147483647"),
        ({"serving": {"capacity_rps": 1, "max_replicas": 2**40}}, "serving.max_replicas"),
        ({"requests": {"cpu": 1e300}}, "requests.cpu: Input should be less than or equal"),
        ({"serving": {"capacity_rps": 1, "lead_time_seconds": 1e300}}, "lead_time_seconds"),
        ({"workload": {"kind": "Job", "namespace": "n" * 64, "name": "a"}}, "workload.namespace"),
    ],
)
def test_values_the_cluster_cannot_mean_are_refused_naming_the_field_and_bound(
    changes: dict[str, object], fragment: str
) -> None:
    data = _workload_changed(**changes)
    event = events.encode(events.WorkloadChanged.model_validate(_workload_changed()), source="t")
    body = json.loads(event)
    body["data"] = data
    with pytest.raises(events.EventRejected) as caught:
        events.decode(json.dumps(body).encode())
    assert caught.value.kind == "invalid"
    assert fragment in caught.value.reason
    assert "\n" not in caught.value.reason


def test_the_longest_legal_names_are_accepted_and_round_trip() -> None:
    ref = events.WorkloadRef(kind="Deployment", namespace="n" * 63, name=("a." * 127)[:252] + "z")
    command = VALID_COMMAND.model_copy(update={"target": ref, "desired": 2**31 - 1})
    decoded = events.decode(events.encode(command, source="t"), events.ScaleCommand)
    assert decoded.data == command


def test_the_quantile_grid_is_the_forecast_points_fields() -> None:
    from tideshift.events.models import QUANTILE_LEVELS, ForecastPoint

    fields = [name for name in ForecastPoint.model_fields if name.startswith("q")]
    assert fields == [ForecastPoint.field_of(level) for level in QUANTILE_LEVELS]
    at = datetime(2026, 3, 1, tzinfo=UTC)
    values = {level: 10.0 * (i + 1) for i, level in enumerate(QUANTILE_LEVELS)}
    assert ForecastPoint.of(at, 5.0, values).quantiles() == values

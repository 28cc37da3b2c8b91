"""Which admitted Kueue jobs Tideshift may resize (workload slices) and which it leaves to Kueue."""

from __future__ import annotations

from typing import Any

import pytest

from tideshift.services.cluster.core.engines import (
    KUEUE_ELASTIC_ANNOTATION,
    KUEUE_ELASTIC_GATE,
    KUEUE_QUEUE_LABEL,
    KUEUE_SIZE_PREFIX,
    kueue_hold,
    kueue_size_owner,
)


def job(
    *, queue: str | None = "q", suspend: bool = False, elastic: bool = True, gated: bool = True
) -> dict[str, Any]:
    labels = {KUEUE_QUEUE_LABEL: queue} if queue else {}
    annotations = {KUEUE_ELASTIC_ANNOTATION: "true"} if elastic else {}
    gates = [{"name": KUEUE_ELASTIC_GATE}] if gated else []
    return {
        "metadata": {"name": "j", "labels": labels, "annotations": annotations},
        "spec": {
            "suspend": suspend,
            "parallelism": 2,
            "template": {"spec": {"schedulingGates": gates, "containers": []}},
        },
    }


def test_an_admitted_elastic_job_gated_by_kueue_is_ours_to_resize() -> None:
    assert kueue_size_owner("Job.batch", job()) is None


def test_a_job_without_kueue_is_ours_and_a_suspended_one_is_kueue_holds() -> None:
    assert kueue_size_owner("Job.batch", job(queue=None, elastic=False)) is None
    suspended = job(suspend=True, elastic=False)
    assert kueue_size_owner("Job.batch", suspended) is None
    assert kueue_hold(suspended) is not None


@pytest.mark.parametrize(
    ("kind", "obj", "names"),
    [
        ("Job.batch", job(elastic=False), KUEUE_ELASTIC_ANNOTATION),
        ("Job.batch", job(gated=False), "ElasticJobsViaWorkloadSlices"),
        ("PyTorchJob.kubeflow.org", job(), "no workload slices for PyTorchJob.kubeflow.org"),
    ],
)
def test_an_admitted_job_kueue_would_evict_on_resize_is_left_to_kueue(
    kind: str, obj: dict[str, Any], names: str
) -> None:
    why = kueue_size_owner(kind, obj)
    assert why is not None and why.startswith(KUEUE_SIZE_PREFIX)
    assert names in why and "'q'" in why


def test_kubeflow_run_policy_suspend_counts_as_not_admitted() -> None:
    obj = job()
    obj["spec"] = {"runPolicy": {"suspend": True}}
    assert kueue_size_owner("PyTorchJob.kubeflow.org", obj) is None

"""A refused write carries the apiserver's own words (a webhook's or admission policy's
reason) into the error the executor reports, not only the HTTP status."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.adapters.http import message_of
from tideshift.services.cluster.kubernetes import _classified
from tideshift.services.cluster.port import ClusterError, WorkloadRef

TARGET = WorkloadRef("ml", "PyTorchJob.kubeflow.org", "bert")


def refused(body: object, status: int = 422) -> ApiException:
    error = ApiException(status=status, reason="Unprocessable Entity")
    error.body = body if isinstance(body, (bytes, str)) else json.dumps(body).encode()
    return error


def test_the_status_message_is_read_from_the_answer() -> None:
    said = 'admission webhook "vpytorchjob.kb.io" denied the request: replicas out of range'
    assert message_of(refused({"kind": "Status", "message": said})) == said


def test_answers_without_words_give_nothing_not_an_error() -> None:
    assert message_of(refused(b"")) == ""
    assert message_of(refused(b"<html>bad gateway</html>")) == ""
    assert message_of(refused({"kind": "Status"})) == ""
    assert message_of(refused([1, 2])) == ""
    assert message_of(ValueError("not an API error")) == ""


def test_a_classified_refusal_names_the_status_and_the_reason() -> None:
    error = _classified(TARGET, "write", refused({"message": "denied: resizing is frozen"}))
    assert isinstance(error, ClusterError) and not error.transient
    assert str(error) == (
        "write PyTorchJob.kubeflow.org/ml/bert: HTTP 422 Unprocessable Entity: "
        "denied: resizing is frozen"
    )

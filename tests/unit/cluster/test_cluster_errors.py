"""The Kubernetes port classifies client errors, so services never see the client's types."""

from __future__ import annotations

import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.kubernetes import _classified
from tideshift.services.cluster.port import ClusterError, WorkloadRef

TARGET = WorkloadRef("shop", "Deployment", "web")


def test_not_found_is_a_key_error() -> None:
    assert isinstance(_classified(TARGET, "read", ApiException(status=404)), KeyError)


@pytest.mark.parametrize("status", [409, 429, 500, 502, 503, 504])
def test_retryable_answers_are_transient(status: int) -> None:
    error = _classified(TARGET, "write", ApiException(status=status, reason="Busy"))
    assert isinstance(error, ClusterError) and error.transient and error.status == status
    assert f"HTTP {status} Busy" in str(error) and "Deployment.apps/shop/web" in str(error)


@pytest.mark.parametrize("status", [400, 403, 422])
def test_definite_answers_are_not_transient(status: int) -> None:
    error = _classified(TARGET, "write", ApiException(status=status, reason="No"))
    assert isinstance(error, ClusterError) and not error.transient


def test_network_trouble_is_transient() -> None:
    error = _classified(TARGET, "read", urllib3.exceptions.ProtocolError("connection reset"))
    assert isinstance(error, ClusterError) and error.transient and error.status is None

"""Fixtures shared by the watcher and executor tests on the real control plane."""

from collections.abc import Iterator
from typing import Any

import pytest

from tideshift.services.cluster.adapters.http import KubeHttp


@pytest.fixture
def admin(k8s_cluster: Any) -> Iterator[KubeHttp]:
    """Raw JSON access to the apiserver as cluster admin."""
    with k8s_cluster.api_client() as api_client:
        yield KubeHttp(api_client)

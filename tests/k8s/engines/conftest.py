"""A control plane with the real engines (Kueue, the training operator, KubeRay) for this
package only: their webhooks and controllers would change what the other k8s tests see, so
they get a cluster of their own, started once for the package and stopped after it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.requirements import missing_dependency
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster
from tideshift.services.devcluster.engines import (
    ENGINE_NAMES,
    ENGINES_BUILD_HINT,
    default_engines_dir,
    stale_engine_files,
)
from tideshift.services.devcluster.nodes import default_nodes
from tideshift.services.devcluster.processes import wait_for

NODES = default_nodes(3, cpu="8", memory="32Gi", gpu_nodes=1, gpus_per_node=4)


@pytest.fixture(scope="package")
def engines_dir() -> Path:
    """The built engines: fails under CI, skips elsewhere, when they are missing or stale."""
    directory = default_engines_dir()
    stale = stale_engine_files(directory, ENGINE_NAMES)
    if stale:
        missing_dependency(
            f"engines missing or stale in {directory} ({'; '.join(stale)}): {ENGINES_BUILD_HINT}"
        )
    return directory


@pytest.fixture(scope="package")
def engines_cluster(
    k8s_bin_dir: Path, engines_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("k8s-engines")
    options = ClusterOptions(
        bin_dir=k8s_bin_dir,
        state_dir=state_dir,
        nodes=NODES,
        engines=ENGINE_NAMES,
        engines_dir=engines_dir,
        # A loaded two-core machine: the engines start after the control plane.
        start_timeout=180.0,
        engine_timeout=240.0,
    )
    local = LocalCluster(options)
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture
def engine_admin(engines_cluster: LocalCluster) -> Iterator[KubeHttp]:
    with engines_cluster.api_client() as api_client:
        yield KubeHttp(api_client)


@pytest.fixture
def engine_namespace(engine_admin: KubeHttp, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists; deleted afterwards."""
    name = f"e-{request.node.name.lower()[:30].strip('-_')}-{uuid.uuid4().hex[:6]}"
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    engine_admin.json(
        "POST", "/api/v1/namespaces", body={"metadata": {"name": name}, "kind": "Namespace"}
    )

    def ready() -> bool:
        items = engine_admin.get(f"/api/v1/namespaces/{name}/serviceaccounts")["items"]
        return any(item["metadata"]["name"] == "default" for item in items)

    wait_for(ready, timeout=60, what=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        engine_admin.json("DELETE", f"/api/v1/namespaces/{name}")

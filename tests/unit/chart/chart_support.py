"""Running the real `helm` binary on charts/tideshift, shared by the chart and k8s tests.

helm comes from tests/cluster/build.sh (beside the control-plane binaries), else from PATH.
Without it the tests skip, or fail in CI, saying how to build it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.requirements import missing_dependency
from tideshift.services.devcluster.versions import (
    BUILD_HINT,
    HELM_VERSION,
    default_bin_dir,
    stale_binaries,
)

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "tideshift"
SERVICES = ("watcher", "predictor", "planner", "executor")
HELM_TIMEOUT = 120


class HelmFailed(AssertionError):
    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}"
        )
        self.stderr = result.stderr
        self.stdout = result.stdout


def helm_binary() -> Path:
    bin_dir = default_bin_dir()
    if "helm" not in stale_binaries(bin_dir):
        return bin_dir / "helm"
    found = shutil.which("helm")
    if found:
        return Path(found)
    missing_dependency(f"helm {HELM_VERSION} not found in {bin_dir} nor on PATH: {BUILD_HINT}")


def run_helm(
    *args: str, env: Mapping[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """helm with its own config/cache dirs, so tests neither read nor write the user's."""
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "tideshift-helm-home"
    helm_env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        **(env or {}),
    }
    result = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT,
        env=helm_env,
        check=False,
    )
    if check and result.returncode != 0:
        raise HelmFailed(args, result)
    return result


def values_args(values: Mapping[str, Any] | None, tmp_path: Path) -> list[str]:
    if not values:
        return []
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return ["--values", str(path)]


def render(
    tmp_path: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "ts",
    namespace: str = "tideshift",
) -> list[dict[str, Any]]:
    """`helm template` of the chart: every rendered object, in order."""
    result = run_helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        *values_args(values, tmp_path),
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(tmp_path: Path, values: Mapping[str, Any]) -> str:
    """The error `helm template` prints for values it must reject."""
    result = run_helm("template", "ts", str(CHART), *values_args(values, tmp_path), check=False)
    assert result.returncode != 0, f"helm accepted values it should reject: {values}"
    return result.stderr


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def container_env(deployment: dict[str, Any]) -> dict[str, Any]:
    """name -> value (a string) or valueFrom (a dict) of the first container."""
    env = deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in env}


def rbac_file_rules() -> dict[str, list[dict[str, Any]]]:
    """Rules per service from files/rbac.yaml (the watcher/executor's source of truth)."""
    path = CHART / "files" / "rbac.yaml"
    if not path.exists():
        return {}
    rules: dict[str, list[dict[str, Any]]] = {}
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == "ClusterRole":
            name = document["metadata"]["name"]
            for service in SERVICES:
                if name.endswith(f"-{service}"):
                    rules[service] = document.get("rules") or []
    return rules


def load_schema_builder() -> Any:
    """charts/tideshift/schema/build_values_schema.py as a module (it is not a package)."""
    import importlib.util

    path = CHART / "schema" / "build_values_schema.py"
    spec = importlib.util.spec_from_file_location("tideshift_chart_schema_builder", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

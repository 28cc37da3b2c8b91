"""`tideshift whatif` as the README shows it: three weeks of the NASA trace (x100) backfilled into
a real Prometheus, the local control plane's four nodes with a labelled serving Deployment and
a training Job (tests/k8s/test_whatif_k8s.py), the last 14 days replayed at a one-minute step
with the default forecasting model. Prints the command's output and its wall time, and copies
the Tideshift plot to docs/images/whatif-tideshift.png.

Run: .venv/bin/pytest -s tests/benchmarks/bench_whatif.py
(WHATIF_STEP=10m for a coarser, faster replay, the default being 1m; WHATIF_MODEL=NAME for
another forecasting model than the predictor's default.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.test_whatif_k8s import backfilled_prometheus, create_workloads, tideshift
from tideshift.services.cluster.adapters.http import KubeHttp

REPO = Path(__file__).resolve().parents[2]
ARGS = (
    *("--since", "14d", "--history", "1d", "--step", os.environ.get("WHATIF_STEP", "1m")),
    *(("--model", os.environ["WHATIF_MODEL"]) if "WHATIF_MODEL" in os.environ else ()),
)


@pytest.mark.timeout(3600)
def test_whatif_on_two_weeks(
    k8s_cluster: Any, k8s_namespace: str, prometheus_binary: str, tmp_path: Path
) -> None:
    with k8s_cluster.api_client() as api_client:
        create_workloads(KubeHttp(api_client), k8s_namespace)
    (tmp_path / "prometheus").mkdir()
    with backfilled_prometheus(prometheus_binary, tmp_path / "prometheus") as url:
        out = tmp_path / "whatif"
        argv = tideshift(
            "whatif", "--prometheus", url, "--kubeconfig", str(k8s_cluster.kubeconfig),
            "--namespace", k8s_namespace, *ARGS, "--out", str(out),
        )  # fmt: skip
        started = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=3500, check=False)
        wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    print(f"\n$ tideshift whatif --prometheus URL --kubeconfig K --namespace NS {' '.join(ARGS)}")
    print(result.stdout)
    print(f"wall time: {wall:.0f} s")
    images = REPO / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "whatif-tideshift.png", images / "whatif-tideshift.png")

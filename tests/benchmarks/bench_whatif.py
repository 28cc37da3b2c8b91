"""`tideshift whatif` as docs/guides/whatif.md shows it: three weeks of the NASA trace (x100)
backfilled into a real Prometheus, a local control plane with four nodes (tests/fixtures/k8s.py's)
holding a labelled serving Deployment and a training Job (tests/k8s/test_whatif_k8s.py), the last 14
days replayed at a one-minute step with the default forecasting model. Prints the command's output
and its wall time, and copies the Tideshift plot to docs/images/whatif-tideshift.png.

Usage: .venv/bin/python tests/benchmarks/bench_whatif.py [--step 10m] [--model NAME] [--out PNG]
(--step 10m for a coarser, faster replay, the default being 1m; --model for another forecasting
model than the predictor's default). It asserts nothing; a failed step exits 1 saying why.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fixtures.k8s import DEFAULT_NODES  # noqa: E402
from tests.k8s.cluster_objects import create, wait_until  # noqa: E402
from tests.k8s.test_whatif_k8s import (  # noqa: E402
    backfilled_prometheus,
    create_workloads,
    tideshift,
)
from tideshift.services.cluster.adapters.http import KubeHttp  # noqa: E402
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster  # noqa: E402
from tideshift.services.devcluster.versions import default_bin_dir  # noqa: E402

NAMESPACE = "bench-whatif"
DEFAULT_OUT = ROOT / "docs" / "images" / "whatif-tideshift.png"


def whatif_args(args: argparse.Namespace) -> list[str]:
    model = ["--model", args.model] if args.model else []
    return ["--since", "14d", "--history", "1d", "--step", args.step, *model]


def run(args: argparse.Namespace, work: Path) -> int:
    prometheus = shutil.which("prometheus")
    if prometheus is None or shutil.which("promtool") is None:
        print("error: prometheus and promtool are needed: apt-get install prometheus")
        return 1
    print("starting a control plane with 4 kwok nodes ...", flush=True)
    cluster = LocalCluster(
        ClusterOptions(bin_dir=default_bin_dir(), state_dir=work / "k8s", nodes=DEFAULT_NODES)
    )
    try:
        cluster.start()
        with cluster.api_client() as api_client:
            admin = KubeHttp(api_client)
            create(admin, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            accounts = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
            wait_until(
                lambda: any(
                    a["metadata"]["name"] == "default" for a in admin.get(accounts)["items"]
                ),
                what="the default ServiceAccount",
            )
            create_workloads(admin, NAMESPACE)
        print("backfilling Prometheus with 21 days of the trace ...", flush=True)
        (work / "prometheus").mkdir()
        with backfilled_prometheus(prometheus, work / "prometheus") as url:
            out = work / "whatif"
            argv = tideshift(
                "whatif", "--prometheus", url, "--kubeconfig", str(cluster.kubeconfig_path),
                "--namespace", NAMESPACE, *whatif_args(args), "--out", str(out),
            )  # fmt: skip
            print("running tideshift whatif ...", flush=True)
            started = time.perf_counter()
            result = subprocess.run(argv, capture_output=True, text=True, timeout=3500, check=False)
            wall = time.perf_counter() - started
    finally:
        cluster.stop()
    if result.returncode != 0:
        print(f"error: tideshift whatif exited {result.returncode}:\n{result.stderr}")
        return 1
    shown = " ".join(whatif_args(args))
    print(f"\n$ tideshift whatif --prometheus URL --kubeconfig K --namespace NS {shown}")
    print(result.stdout)
    print(f"wall time: {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "whatif-tideshift.png", args.out)
    print(f"plot: {args.out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", default="1m", help="the replay's step (default 1m)")
    parser.add_argument("--model", help="a forecasting model (default: the predictor's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default {DEFAULT_OUT})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tideshift-bench-whatif-") as work:
        try:
            return run(args, Path(work))
        except subprocess.CalledProcessError as error:
            print(f"error: {' '.join(error.cmd)} exited {error.returncode}: {error.stderr}")
        except (TimeoutError, RuntimeError, OSError) as error:
            print(f"error: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

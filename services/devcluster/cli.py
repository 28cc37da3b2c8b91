"""`tideshift dev cluster up|down|env|status`: the test control plane, for people and the demo.

`up` starts the cluster in the background and keeps its state (certificates, etcd data, logs,
pids) in one directory; `env` prints the KUBECONFIG export; `down` stops it and removes the
directory. `up` also starts the engines users run beside Tideshift (Kueue, the Kubeflow training
operator, KubeRay; `--without` leaves any of them out), with their logs in the same directory.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tideshift.services.devcluster.cluster import (
    ADMIN_KUBECONFIG,
    ClusterOptions,
    ClusterStartError,
    LocalCluster,
)
from tideshift.services.devcluster.engines import (
    ENGINE_NAMES,
    ENGINES,
    MissingEnginesError,
    default_engines_dir,
    parse_engine_list,
)
from tideshift.services.devcluster.nodes import default_nodes
from tideshift.services.devcluster.processes import (
    STATE_FILE,
    load_state,
    record_alive,
    state_processes,
    terminate_processes,
)
from tideshift.services.devcluster.versions import (
    K8S_VERSION,
    MissingBinariesError,
    cache_root,
    default_bin_dir,
)

# Marks a directory as ours, so `up` only ever wipes directories it created.
_MARKER = ".tideshift-devcluster"
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi)?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {value}")
    return value


def _quantity(text: str) -> str:
    if not _QUANTITY.match(text):
        raise argparse.ArgumentTypeError(
            f"expected a Kubernetes quantity such as 8, 500m or 32Gi, got {text!r}"
        )
    return text


def _engine_list(text: str) -> list[str]:
    try:
        return parse_engine_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _LABEL_KEY.match(key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with a valid label key, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift dev",
        description="Developer tools. `cluster` runs a real local Kubernetes control plane "
        f"({K8S_VERSION}: etcd, apiserver, controller-manager, scheduler, kwok fake nodes).",
    )
    tools = parser.add_subparsers(dest="tool", required=True, metavar="cluster")
    cluster = tools.add_parser("cluster", help="local Kubernetes control plane")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="up|down|env|status")

    default_state = cache_root() / "devcluster"

    def add_common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--state-dir",
            type=Path,
            default=default_state,
            help=f"where certificates, etcd data, logs and pids live (default {default_state})",
        )

    up = actions.add_parser("up", help="start the cluster in the background")
    add_common(up)
    _add_up_arguments(up)
    for name, text in (
        ("down", "stop the cluster and remove its state directory"),
        ("env", "print the KUBECONFIG export for a running cluster"),
        ("status", "show whether each component is running"),
    ):
        add_common(actions.add_parser(name, help=text))
    return parser


def _add_up_arguments(up: argparse.ArgumentParser) -> None:
    """`up`'s own options: where the binaries are, the nodes, what to install, how to run."""
    up.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help=f"control-plane binaries (default {default_bin_dir()}, env TIDESHIFT_K8S_BIN_DIR)",
    )
    up.add_argument("--nodes", type=_non_negative_int, default=3, help="CPU nodes (default 3)")
    up.add_argument("--gpu-nodes", type=_non_negative_int, default=1, help="GPU nodes (default 1)")
    up.add_argument(
        "--gpus-per-node", type=_non_negative_int, default=4, help="nvidia.com/gpu per GPU node"
    )
    up.add_argument("--node-cpu", type=_quantity, default="8", help="cpu per node (default 8)")
    up.add_argument(
        "--node-memory", type=_quantity, default="32Gi", help="memory per node (default 32Gi)"
    )
    up.add_argument(
        "--node-label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label for every node (repeatable)",
    )
    up.add_argument(
        "--timeout", type=_positive_float, default=120.0, help="start-up timeout in seconds"
    )
    up.add_argument(
        "--no-crds",
        action="store_true",
        help="do not install the Volcano Job and PyTorchJob CRDs",
    )
    engines = ", ".join(f"{name} ({ENGINES[name].version})" for name in ENGINE_NAMES)
    up.add_argument(
        "--without",
        type=_engine_list,
        action="append",
        default=[],
        metavar="ENGINE[,ENGINE]",
        help=f"engines not to start (default: start all of {engines}; repeatable)",
    )
    up.add_argument(
        "--engines-dir",
        type=Path,
        default=None,
        help=f"engine binaries and manifests (default {default_engines_dir()}, "
        "env TIDESHIFT_ENGINES_DIR)",
    )
    up.add_argument(
        "--no-storage",
        action="store_true",
        help="do not create the default StorageClass and its volumes",
    )
    up.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; Ctrl-C stops the cluster",
    )


def _engines(without: list[list[str]]) -> list[str]:
    left_out = {name for names in without for name in names}
    return [name for name in ENGINE_NAMES if name not in left_out]


def _running(state_dir: Path) -> bool:
    state = load_state(state_dir)
    if state is None:
        return False
    return all(record_alive(record) for record in state_processes(state))


def _up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    if _running(state_dir):
        print(f"dev cluster already running (state in {state_dir})")
        print(f"export KUBECONFIG={state_dir / ADMIN_KUBECONFIG}")
        return 0
    if state_dir.exists() and any(state_dir.iterdir()):
        if not (state_dir / _MARKER).exists():
            print(
                f"tideshift dev cluster: --state-dir {state_dir} is not empty and was not "
                "created by `dev cluster up`; choose another directory",
                file=sys.stderr,
            )
            return 2
        _stop(state_dir, quiet=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / _MARKER).touch()

    options = ClusterOptions(
        bin_dir=args.bin_dir or default_bin_dir(),
        state_dir=state_dir,
        nodes=default_nodes(
            args.nodes,
            cpu=args.node_cpu,
            memory=args.node_memory,
            gpu_nodes=args.gpu_nodes,
            gpus_per_node=args.gpus_per_node,
            labels=dict(args.node_label),
        ),
        die_with_parent=args.foreground,
        start_timeout=args.timeout,
        workload_crds=not args.no_crds,
        storage=not args.no_storage,
        engines=_engines(args.without),
        engines_dir=args.engines_dir,
    )
    cluster = LocalCluster(options)
    try:
        cluster.start(progress=lambda message: print(f"dev cluster: {message}", flush=True))
    except (MissingBinariesError, MissingEnginesError) as error:
        print(f"tideshift dev cluster: {error}", file=sys.stderr)
        return 1
    except (ClusterStartError, TimeoutError) as error:
        print(f"tideshift dev cluster: start failed: {error}", file=sys.stderr)
        print(f"logs: {state_dir / 'logs'}", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={cluster.kubeconfig_path}")
    if not args.foreground:
        cluster.detach()
        print("stop it with: tideshift dev cluster down")
        return 0
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    print("running in the foreground; Ctrl-C stops it", flush=True)
    stopped.wait()
    cluster.stop()
    shutil.rmtree(state_dir, ignore_errors=True)
    print("dev cluster stopped")
    return 0


def _stop(state_dir: Path, *, quiet: bool = False) -> list[str]:
    state = load_state(state_dir)
    stopped = terminate_processes(state_processes(state)) if state else []
    if (state_dir / _MARKER).exists() or (state_dir / STATE_FILE).exists():
        shutil.rmtree(state_dir, ignore_errors=True)
    if not quiet and stopped:
        print(f"stopped {', '.join(stopped)}")
    return stopped


def _down(args: argparse.Namespace) -> int:
    if load_state(args.state_dir) is None:
        print(f"no dev cluster state in {args.state_dir}; nothing to stop")
        if (args.state_dir / _MARKER).exists():
            shutil.rmtree(args.state_dir, ignore_errors=True)
        return 0
    _stop(args.state_dir)
    print("dev cluster down")
    return 0


def _env(args: argparse.Namespace) -> int:
    if not _running(args.state_dir):
        print(
            f"tideshift dev cluster: no cluster is running (state dir {args.state_dir}); "
            "start one with `tideshift dev cluster up`",
            file=sys.stderr,
        )
        return 1
    print(f"export KUBECONFIG={args.state_dir / ADMIN_KUBECONFIG}")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = load_state(args.state_dir)
    if state is None:
        print(f"no dev cluster in {args.state_dir}")
        return 1
    print(f"Kubernetes {state.get('k8s_version')} at {state.get('server')}")
    engines = state.get("engines") or {}
    if engines:
        print("engines: " + ", ".join(f"{name} {version}" for name, version in engines.items()))
    records = state_processes(state)
    for record in records:
        condition = "running" if record_alive(record) else "STOPPED"
        print(f"  {record.name:<24} pid {record.pid:<8} {condition}")
    return 0 if all(record_alive(record) for record in records) else 1


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    handlers = {"up": _up, "down": _down, "env": _env, "status": _status}
    return handlers[args.action](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

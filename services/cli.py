"""The `tideshift` command: one entry point, one subcommand per capability.

Subcommands are listed here explicitly and imported lazily, so `tideshift --help` stays fast
and a missing optional dependency of one subcommand cannot break the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence

# name -> ("module:function", one-line help). Each function takes the remaining argv and
# returns a process exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "nats": (
        "tideshift.services.common.embedded_nats:main",
        "run the bundled nats-server (JetStream + MQTT)",
    ),
    "events": (
        "tideshift.services.common.events_cli:main",
        "tail events or print the AsyncAPI schema",
    ),
    "run": (
        "tideshift.services.runner:main",
        "run one service: watcher, predictor, planner, executor, ...",
    ),
    "scale": (
        "tideshift.services.executor.scale_cli:main",
        "manual scale override through the bus",
    ),
    "explain": (
        "tideshift.services.insight.cli:explain_main",
        "one target's decisions over time, and what the executor did",
    ),
    "status": (
        "tideshift.services.insight.cli:status_main",
        "the current picture: planners, workloads, jobs, what nodes lend",
    ),
    "backtest": (
        "tideshift.services.predictor.backtest:main",
        "rolling-origin backtest of forecasters",
    ),
    "simulate": (
        "tideshift.services.simulator.cli:main",
        "run policies side by side on the sim cluster",
    ),
    "trace": (
        "tideshift.services.whatif.cli:trace_main",
        "trace export: a Prometheus query's history as a trace CSV",
    ),
    "whatif": (
        "tideshift.services.whatif.cli:whatif_main",
        "what Tideshift would have done on your cluster's own history",
    ),
    "loadgen": ("tideshift.loadgen.cli:main", "open-loop HTTP load generator"),
    "serve-sample": ("tideshift.loadgen.sample_app:main", "sample serving app with fixed capacity"),
    "training": (
        "tideshift.services.trainer.training_cli:main",
        "a training job: status | export (its model) | reset",
    ),
    "demo": ("tideshift.services.demo.cli:main", "a whole day and night in minutes"),
    "dev": (
        "tideshift.services.devcluster.cli:main",
        "local Kubernetes control plane: dev cluster up|down|env",
    ),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: tideshift [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run `tideshift <command> --help` for a command's options."]
    return "\n".join(lines)


def _resolve(target: str) -> Callable[[Sequence[str]], int]:
    module_name, function_name = target.split(":")
    function: Callable[[Sequence[str]], int] = getattr(
        importlib.import_module(module_name), function_name
    )
    return function


def _extra_providing(module: str) -> str | None:
    """The optional extra of ours (pyproject.toml) that installs the package `module`, if any."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted = canonicalize_name(module.partition(".")[0])
    metadata = importlib.metadata.metadata("tideshift")
    requirements = [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]
    for extra in metadata.get_all("Provides-Extra") or []:
        if any(
            canonicalize_name(requirement.name) == wanted
            and requirement.marker is not None
            and requirement.marker.evaluate({"extra": extra})
            for requirement in requirements
        ):
            return str(extra)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    if args[0] == "--version":
        print(f"tideshift {importlib.metadata.version('tideshift')}")
        return 0
    name, rest = args[0], args[1:]
    # Before numpy loads OpenBLAS: its worker threads are shut down by a fork in another
    # thread (a service starting nats-server or a trainer) and a fit mid-call then waits for
    # them for ever (OpenBLAS #5520, numpy #30092). Fits already run in threads of their own.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if name not in SUBCOMMANDS:
        print(f"tideshift: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        return _resolve(SUBCOMMANDS[name][0])(rest)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as error:
        # An image or install without one of our extras (the core image has no forecasters).
        extra = _extra_providing(error.name or "")
        if extra is None:
            raise
        print(
            f"tideshift {name}: needs the {extra!r} extra ({error}): "
            f"pip install 'tideshift[{extra}]', or use the image that has it",
            file=sys.stderr,
        )
        return 2
    except OSError as error:
        # A path the user named that cannot be opened is their input error, not our bug; any
        # other OSError (no filename) still shows its traceback.
        if error.filename is None or isinstance(error, BrokenPipeError):
            raise
        print(f"tideshift {name}: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

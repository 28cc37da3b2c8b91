"""`tideshift run <service>`: the registry of long-running services.

Each entry names a module whose `main(argv) -> int` parses that service's settings and runs it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SERVICES: dict[str, str] = {
    "watcher": "tideshift.services.watcher.service",
    "executor": "tideshift.services.executor.service",
    "predictor": "tideshift.services.predictor.service",
    "planner": "tideshift.services.planner.service",
    "coordinator": "tideshift.services.trainer.coordinator.service",
    "pserver": "tideshift.services.trainer.pserver.service",
    "trainer": "tideshift.services.trainer.worker",
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(
            "usage: tideshift run <service> [--help] [options]\n\nservices: " + ", ".join(SERVICES)
        )
        return 0 if argv else 2
    name = argv[0]
    if name not in SERVICES:
        print(
            f"tideshift run: unknown service {name!r}; expected one of {', '.join(SERVICES)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(SERVICES[name])
    code: int = module.main(list(argv[1:]))
    return code

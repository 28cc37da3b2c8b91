"""The pure-module list is kept once: every configuration that repeats it must agree with it.

`[tool.tideshift] pure-modules` in pyproject.toml names each pure decision module (a file) or
package (a folder, ending in `/`). ruff's TID251 ignore glob, mypy's strict overrides, the
import-linter contract "pure decision modules do no I/O" and the marked list in
docs/ARCHITECTURE.md cannot read that list, so `make lint` runs this: one line per entry a copy
lacks or adds, exit 1. Usage: python .ci/check_pure_modules.py (from the repository root).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PURE_CONTRACT = "pure decision modules do no I/O"
# mypy is strict on the event contract too, which is not a decision module.
STRICT_BESIDES_PURE = {"tideshift.events.*"}
ARCHITECTURE_START = "<!-- pure-modules"
ARCHITECTURE_END = "<!-- /pure-modules -->"


def dotted(path: str) -> str:
    """`services/planner/inputs.py` -> `tideshift.services.planner.inputs` (folders likewise)."""
    return "tideshift." + path.removesuffix("/").removesuffix(".py").replace("/", ".")


def ruff_glob(path: str) -> str:
    return path + "**" if path.endswith("/") else path


def mypy_module(path: str) -> str:
    return dotted(path) + ".*" if path.endswith("/") else dotted(path)


def ruff_copy(config: dict[str, Any]) -> set[str]:
    """The paths in the negated glob that TID251 is ignored outside of."""
    ignores = config["tool"]["ruff"]["lint"]["per-file-ignores"]
    (negated,) = [key for key, rules in ignores.items() if rules == ["TID251"]]
    return set(negated.removeprefix("!{").removesuffix("}").split(","))


def mypy_copy(config: dict[str, Any]) -> set[str]:
    strict = [entry for entry in config["tool"]["mypy"]["overrides"] if entry.get("strict")]
    return {module for entry in strict for module in entry["module"]} - STRICT_BESIDES_PURE


def import_linter_copy(config: dict[str, Any]) -> set[str]:
    contracts = config["tool"]["importlinter"]["contracts"]
    (pure,) = [contract for contract in contracts if contract["name"] == PURE_CONTRACT]
    return set(pure["source_modules"])


def architecture_copy(markdown: str) -> set[str]:
    """The backquoted paths between the pure-modules markers of docs/ARCHITECTURE.md."""
    start = markdown.find(ARCHITECTURE_START)
    end = markdown.find(ARCHITECTURE_END, start)
    if start < 0 or end < 0:
        return set()
    return set(re.findall(r"`([^`]+)`", markdown[start:end].split("-->", 1)[1]))


def differences(where: str, expected: set[str], found: set[str]) -> Iterator[str]:
    for missing in sorted(expected - found):
        yield f"{where}: missing {missing}"
    for extra in sorted(found - expected):
        yield f"{where}: not in [tool.tideshift] pure-modules: {extra}"


def disagreements(config: dict[str, Any], architecture: str, root: Path) -> Iterator[str]:
    """One message per entry that a copy of the pure-module list lacks or adds."""
    canonical = config["tool"]["tideshift"]["pure-modules"]
    for path in canonical:
        if not (root / path).exists():
            yield f"pyproject.toml [tool.tideshift] pure-modules: {path} does not exist"
    yield from differences(
        "pyproject.toml [tool.ruff.lint.per-file-ignores] TID251 glob",
        {ruff_glob(path) for path in canonical},
        ruff_copy(config),
    )
    yield from differences(
        "pyproject.toml [[tool.mypy.overrides]] strict modules",
        {mypy_module(path) for path in canonical},
        mypy_copy(config),
    )
    yield from differences(
        f'pyproject.toml import-linter contract "{PURE_CONTRACT}" source_modules',
        {dotted(path) for path in canonical},
        import_linter_copy(config),
    )
    yield from differences(
        "docs/ARCHITECTURE.md pure-modules list", set(canonical), architecture_copy(architecture)
    )


def main(root: Path) -> int:
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    architecture = (root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    found = list(disagreements(config, architecture, root))
    for message in found:
        print(message)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(Path.cwd()))

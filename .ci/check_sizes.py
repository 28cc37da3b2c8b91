"""Size limits ruff has no rule for: no function over 60 lines, no module under services/ over 450.

A function's length counts from its `def` line to its last line (a nested function counts in
its parent too); a module's, every line of the file. `make lint` runs this on services/,
events/, loadgen/ and the charts' Python; it prints one line per offender and exits 1.
Usage: python .ci/check_sizes.py [PATH ...] (default: those folders, from the repository root).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_FUNCTION_LINES = 60
MAX_SERVICE_MODULE_LINES = 450
# Modules under this folder are held to the module limit; every checked file to the function one.
SERVICES = "services"
DEFAULT_PATHS = ("services", "events", "loadgen", "charts")


def function_lengths(source: str) -> Iterator[tuple[int, str, int]]:
    """(def line, qualified name, lines from def to last line) of every function in `source`."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            name = getattr(child, "name", "")
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                yield child.lineno, prefix + name, length
                yield from walk(child, f"{prefix}{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{name}.")
            else:
                yield from walk(child, prefix)

    return walk(ast.parse(source), "")


def offences(path: Path, source: str, *, in_services: bool) -> Iterator[str]:
    """One message per limit `source` (the text of `path`) exceeds."""
    lines = len(source.splitlines())
    if in_services and lines > MAX_SERVICE_MODULE_LINES:
        yield f"{path}:1: module is {lines} lines (limit {MAX_SERVICE_MODULE_LINES})"
    for line, name, length in function_lengths(source):
        if length > MAX_FUNCTION_LINES:
            yield f"{path}:{line}: function {name} is {length} lines (limit {MAX_FUNCTION_LINES})"


def python_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_file():
            yield path
        else:
            yield from sorted(
                file for file in path.rglob("*.py") if "__pycache__" not in file.parts
            )


def main(argv: list[str]) -> int:
    paths = [Path(argument) for argument in argv] or [Path(name) for name in DEFAULT_PATHS]
    found = [
        message
        for file in python_files(paths)
        for message in offences(
            file, file.read_text(encoding="utf-8"), in_services=file.parts[0] == SERVICES
        )
    ]
    for message in found:
        print(message)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`.ci/check_sizes.py`: function and module lengths, on small synthetic sources."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / ".ci" / "check_sizes.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_sizes = _checker()


def _function(name: str, body_lines: int, *, indent: str = "", is_async: bool = False) -> str:
    keyword = "async def" if is_async else "def"
    body = "".join(f"{indent}    x{index} = {index}\n" for index in range(body_lines))
    return f"{indent}{keyword} {name}():\n{body}"


def _run_checker(root: Path, folder: str) -> tuple[int, list[str]]:
    """The script's exit status and output lines, run from `root` on `folder`."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), folder],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result.returncode, result.stdout.splitlines()


def test_a_function_counts_from_its_def_line_to_its_last_line() -> None:
    source = "import os\n\n" + _function("f", 4)
    assert list(check_sizes.function_lengths(source)) == [(3, "f", 5)]


def test_methods_nested_and_async_functions_are_named_by_where_they_sit() -> None:
    source = "class Loop:\n" + _function("run", 2, indent="    ", is_async=True)
    source += _function("outer", 1) + _function("inner", 1, indent="    ")
    lengths = {name: (line, length) for line, name, length in check_sizes.function_lengths(source)}
    assert lengths == {"Loop.run": (2, 3), "outer": (5, 4), "outer.inner": (7, 2)}


def test_a_function_of_exactly_the_limit_passes_and_one_more_line_fails() -> None:
    limit = check_sizes.MAX_FUNCTION_LINES
    at_limit = _function("fits", limit - 1)
    over = _function("long", limit)
    assert list(check_sizes.offences(Path("m.py"), at_limit, in_services=True)) == []
    assert list(check_sizes.offences(Path("m.py"), over, in_services=True)) == [
        f"m.py:1: function long is {limit + 1} lines (limit {limit})"
    ]


def test_the_module_limit_holds_under_services_only() -> None:
    limit = check_sizes.MAX_SERVICE_MODULE_LINES
    source = "x = 1\n" * (limit + 1)
    assert list(check_sizes.offences(Path("a.py"), "x = 1\n" * limit, in_services=True)) == []
    assert list(check_sizes.offences(Path("a.py"), source, in_services=True)) == [
        f"a.py:1: module is {limit + 1} lines (limit {limit})"
    ]
    assert list(check_sizes.offences(Path("a.py"), source, in_services=False)) == []


def test_the_command_lists_every_offender_and_fails(tmp_path: Path) -> None:
    services = tmp_path / "services"
    services.mkdir()
    (services / "big.py").write_text(_function("long", 70) + "x = 1\n" * 400)
    (services / "small.py").write_text(_function("short", 3))
    assert _run_checker(tmp_path, "services") == (
        1,
        [
            "services/big.py:1: module is 471 lines (limit 450)",
            "services/big.py:1: function long is 71 lines (limit 60)",
        ],
    )


def test_the_command_passes_on_sources_within_the_limits(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "ok.py").write_text(_function("short", 3))
    assert _run_checker(tmp_path, "events") == (0, [])

"""`.ci/check_pure_modules.py`: every copy of the pure-module list agrees with pyproject's one."""

from __future__ import annotations

import copy
import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_pure_modules", REPO / ".ci" / "check_pure_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _checker()

ARCHITECTURE = """Pure modules:
<!-- pure-modules: checked -->
`services/planner/policy/`, `loadgen/profiles.py`.
<!-- /pure-modules -->
Elsewhere: `services/planner/service.py` is not pure.
"""


def _config() -> dict[str, Any]:
    return {
        "tool": {
            "tideshift": {"pure-modules": ["services/planner/policy/", "loadgen/profiles.py"]},
            "ruff": {
                "lint": {
                    "per-file-ignores": {
                        "tests/**": ["PLR"],
                        "!{services/planner/policy/**,loadgen/profiles.py}": ["TID251"],
                    }
                }
            },
            "mypy": {
                "overrides": [
                    {
                        "module": [
                            "tideshift.events.*",
                            "tideshift.services.planner.policy.*",
                            "tideshift.loadgen.profiles",
                        ],
                        "strict": True,
                    },
                    {"module": ["tideshift.services.demo.*"], "ignore_errors": True},
                ]
            },
            "importlinter": {
                "contracts": [
                    {"name": "other", "source_modules": ["tideshift.services"]},
                    {
                        "name": check.PURE_CONTRACT,
                        "source_modules": [
                            "tideshift.services.planner.policy",
                            "tideshift.loadgen.profiles",
                        ],
                    },
                ]
            },
        }
    }


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "services" / "planner" / "policy").mkdir(parents=True)
    (tmp_path / "loadgen").mkdir()
    (tmp_path / "loadgen" / "profiles.py").touch()
    return tmp_path


def test_copies_that_agree_pass(tmp_path: Path) -> None:
    assert list(check.disagreements(_config(), ARCHITECTURE, _tree(tmp_path))) == []


def test_a_new_pure_module_is_reported_in_every_copy_that_lacks_it(tmp_path: Path) -> None:
    config = copy.deepcopy(_config())
    config["tool"]["tideshift"]["pure-modules"].append("services/planner/state.py")
    root = _tree(tmp_path)
    (root / "services" / "planner" / "state.py").touch()
    assert list(check.disagreements(config, ARCHITECTURE, root)) == [
        "pyproject.toml [tool.ruff.lint.per-file-ignores] TID251 glob: "
        "missing services/planner/state.py",
        "pyproject.toml [[tool.mypy.overrides]] strict modules: "
        "missing tideshift.services.planner.state",
        f'pyproject.toml import-linter contract "{check.PURE_CONTRACT}" source_modules: '
        "missing tideshift.services.planner.state",
        "docs/ARCHITECTURE.md pure-modules list: missing services/planner/state.py",
    ]


def test_an_entry_only_a_copy_has_is_reported(tmp_path: Path) -> None:
    config = copy.deepcopy(_config())
    config["tool"]["mypy"]["overrides"][0]["module"].append("tideshift.services.executor.decision")
    assert list(check.disagreements(config, ARCHITECTURE, _tree(tmp_path))) == [
        "pyproject.toml [[tool.mypy.overrides]] strict modules: "
        "not in [tool.tideshift] pure-modules: tideshift.services.executor.decision"
    ]


def test_a_listed_module_that_is_gone_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "loadgen" / "profiles.py").unlink()
    assert list(check.disagreements(_config(), ARCHITECTURE, root)) == [
        "pyproject.toml [tool.tideshift] pure-modules: loadgen/profiles.py does not exist"
    ]


def test_an_architecture_without_the_marked_list_lacks_every_entry(tmp_path: Path) -> None:
    messages = list(check.disagreements(_config(), "no list here", _tree(tmp_path)))
    assert messages == [
        "docs/ARCHITECTURE.md pure-modules list: missing loadgen/profiles.py",
        "docs/ARCHITECTURE.md pure-modules list: missing services/planner/policy/",
    ]


def test_the_repository_keeps_one_pure_module_list() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    architecture = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    assert list(check.disagreements(config, architecture, REPO)) == []

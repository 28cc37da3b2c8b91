"""One line per chaos scenario: runs, faults injected, items checked, lost, doubled, and the
time to recover (p50/max). Printed by each scenario and gathered in
docs/operations/reliability-table.md."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class ChaosReport:
    scenario: str
    runs: int = 0
    faults: int = 0
    checked: int = 0
    lost: int = 0
    doubled: int = 0
    recovery_s: list[float] = field(default_factory=list)

    def line(self) -> str:
        if self.recovery_s:
            p50 = statistics.median(self.recovery_s)
            recovery = f"{p50:.2f} s / {max(self.recovery_s):.2f} s"
        else:
            recovery = "-"
        return (
            f"| {self.scenario} | {self.runs} | {self.faults} | {self.checked} | {self.lost} | "
            f"{self.doubled} | {recovery} |"
        )

    def print(self) -> None:
        """Shown with `pytest -s` (and in the captured output of a failure)."""
        print(
            "\n| scenario | runs | faults | checked | lost | doubled | recovery p50 / max |\n"
            f"|---|---|---|---|---|---|---|\n{self.line()}"
        )

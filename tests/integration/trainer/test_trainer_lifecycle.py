"""What a user meets before the job runs: a trainer started before its coordinator says it is
waiting, and a SIGTERM in that wait ends it with status 0, not Paddle's C++ signal dump."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from trainer_harness import JobHarness, wait_until

from tideshift.services.common.embedded_nats import EmbeddedNats

pytestmark = pytest.mark.timeout(180)

# Paddle is imported first on purpose: it installs its own SIGTERM handler, which the SDK
# must replace before it starts waiting.
EARLY_TRAINER = """
import paddle
from tideshift.services.trainer.sdk import ElasticJob

job = ElasticJob.connect(spec_timeout=120)
print("connected", flush=True)
"""


async def test_a_trainer_before_its_coordinator_says_it_waits_and_exits_0_on_sigterm(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    script = tmp_path / "early_trainer.py"
    script.write_text(EARLY_TRAINER)
    harness = JobHarness(nats_server.url, f"early-{unique}", tmp_path)
    trainer = harness.script("t-early", script, []).start()
    try:

        async def says_it_waits() -> bool:
            return "waiting for its coordinator" in trainer.stderr_path.read_text()

        await wait_until(says_it_waits, timeout=90, what="the trainer's waiting message")
        trainer.signal(signal.SIGTERM)
        assert await trainer.wait(30) == 0, trainer.tail()
        stderr = trainer.stderr_path.read_text()
        assert "FatalError" not in stderr and "Traceback" not in stderr, stderr
        assert "connected" not in trainer.stdout()
    finally:
        harness.kill_all()

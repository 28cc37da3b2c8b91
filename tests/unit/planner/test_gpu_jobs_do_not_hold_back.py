"""A job that cannot take one more trainer (its GPUs are all taken) does not cap the fair level
of the others: the CPU job gets the cores nobody else can use (issue 26 part 4; on
finite-jobs-gpu medium gang jobs sat at their gang minimum for hours beside idle nodes while
a GPU job was short of GPUs)."""

from __future__ import annotations

from tideshift.services.planner.core import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    PlanState,
    Target,
    TrainingJob,
    plan,
)

GIB = 2**30
GPU_JOB = Target("ml", "PyTorchJob", "vision")
CPU_JOB = Target("ml", "PyTorchJob", "tabular")
NODES = [
    NodeSpec("gpu-0", (32.0, 128 * GIB, 2.0)),
    NodeSpec("cpu-0", (16.0, 64 * GIB, 0.0)),
    NodeSpec("cpu-1", (16.0, 64 * GIB, 0.0)),
]


def desired(*, gpus_wanted: int) -> dict[Target, int]:
    # Same dominant share per trainer-weight (4 of 64 cores at weight 2, 2 of 64 at 1).
    jobs = (
        TrainingJob(GPU_JOB, (4.0, 8 * GIB, 1.0), 1, gpus_wanted, weight=2.0),
        TrainingJob(CPU_JOB, (2.0, 4 * GIB, 0.0), 2, 16, submitted_at=1.0),
    )
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, []),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={GPU_JOB: 0, CPU_JOB: 0},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    return decision.desired()


def test_a_gpu_job_short_of_gpus_leaves_the_cores_to_the_cpu_job() -> None:
    assert desired(gpus_wanted=8) == {GPU_JOB: 2, CPU_JOB: 16}


def test_the_cpu_job_is_as_large_when_the_gpu_job_wants_no_more_than_there_is() -> None:
    assert desired(gpus_wanted=2) == {GPU_JOB: 2, CPU_JOB: 16}

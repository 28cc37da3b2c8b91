"""`simulate --training-through kueue`: the scenario's training run through Kueue instead of
Tideshift's elastic resizing, so the two modes' figures compare on the same day.

Modelled (no Kueue runs here; tests/k8s/engines/test_engines_kueue_day.py measures the real
one): every plan interval, the quota lent to the queue is cluster/core/kueue_quota.py's (the
lender's own rule): capacity less what serving needs over the lead time, growth rate-limited.
Serving's need is the demand's own (replicas at the target utilisation), over the lead time
the true demand ahead: this mode prices Kueue's admission, not the forecast. Kueue then:

* admits whole jobs (each at its nominal trainers, else its maximum, with its parameter
  servers) into what the quota leaves, the highest priority first, then the earliest arrived,
  skipping one that does not fit for the next that does (BestEffortFIFO, Kueue's default);
* when the quota shrinks below what it admitted, the admitted jobs go in Kueue's preemption
  order (the lowest priority, then the most recently admitted) until the rest fit (Tideshift's
  lender deactivates them: Kueue alone would leave them running over quota); an evicted job
  loses its work since its last checkpoint and queues again.

A job's work follows the elastic mode's model (core/training.py): trainers ** speed-up per
second, none for its start-up and restart after each admission.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.cluster.core.kueue_quota import (
    Admitted,
    Amount,
    QuotaConfig,
    QuotaInputs,
    next_quota,
    to_deactivate,
)
from tideshift.services.simulator.scenario import Scenario
from tideshift.services.simulator.world import job_arrivals, serving_need

DEFAULT_LEAD_S = 600.0  # the lender's lead time: serving's need this far ahead is kept
DEFAULT_CHECKPOINT_S = 1800.0  # an evicted job resumes from its last checkpoint


@dataclass
class _Job:
    name: str
    priority: int
    arrival: float
    size: Amount
    trainers: int
    work: float | None
    startup_s: float
    done: float = 0.0
    checkpointed: float = 0.0
    admitted_at: float | None = None
    finished_at: float | None = None

    def admitted(self) -> Admitted:
        assert self.admitted_at is not None
        return Admitted(self.name, self.priority, self.admitted_at, self.size)


@dataclass
class KueueResult:
    training_work: float = 0.0
    preemptions: int = 0
    lost_work: float = 0.0
    jobs_finished: int = 0
    serving_starved_minutes: float = 0.0
    training_cpu_share: float = 0.0  # of the cluster's cpu, on average
    series: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "training_work": round(self.training_work, 1),
            "preemptions": self.preemptions,
            "lost_work": round(self.lost_work, 1),
            "jobs_finished": self.jobs_finished,
            "serving_starved_minutes": round(self.serving_starved_minutes, 1),
            "training_cpu_share": round(self.training_cpu_share, 4),
        }


def _jobs(scenario: Scenario) -> list[_Job]:
    jobs = []
    for arrival, group, name in job_arrivals(scenario):
        trainers = group.nominal_trainers or group.max_trainers
        trainer = Amount(group.trainer.cpu, group.trainer.memory_gib * 2**30, group.trainer.gpu)
        pserver = Amount(group.pserver.cpu, group.pserver.memory_gib * 2**30, group.pserver.gpu)
        size = trainer.scaled(trainers) + pserver.scaled(group.pservers)
        jobs.append(
            _Job(name, group.priority, arrival, size, trainers, group.work, group.startup_delay_s)
        )
    return jobs


def _serving_cpu(scenario: Scenario, profiles: Sequence[RateProfile], t: float) -> Amount:
    total = Amount()
    for spec, profile in zip(scenario.serving, profiles, strict=True):
        replicas = serving_need(spec, profile.rate(t))
        replica = Amount(spec.replica.cpu, spec.replica.memory_gib * 2**30, spec.replica.gpu)
        total = total + replica.scaled(replicas)
    return total


def _capacity(scenario: Scenario) -> Amount:
    capacity = Amount()
    for group in scenario.nodes:
        node = Amount(group.cpu, group.memory_gib * 2**30, group.gpu)
        capacity = capacity + node.scaled(group.count)
    return capacity


@dataclass
class _KueueRun:
    scenario: Scenario
    profiles: Sequence[RateProfile]
    lead_s: float
    checkpoint_s: float
    config: QuotaConfig
    jobs: list[_Job]
    capacity: Amount
    result: KueueResult = field(default_factory=KueueResult)
    quota: Amount | None = None
    grown_at: float | None = None

    def running(self) -> list[_Job]:
        return [j for j in self.jobs if j.admitted_at is not None and j.finished_at is None]

    def lend(self, t: float) -> tuple[Amount, Amount]:
        """The quota for time t (the lender's rule); (serving's need now, over the lead)."""
        now_need = _serving_cpu(self.scenario, self.profiles, t)
        lead = now_need
        samples = max(1, math.ceil(self.lead_s / 60.0))
        for k in range(1, samples + 1):
            ahead = _serving_cpu(self.scenario, self.profiles, t + k * self.lead_s / samples)
            lead = Amount(max(lead.cpu, ahead.cpu), max(lead.memory, ahead.memory),
                          max(lead.gpu, ahead.gpu))  # fmt: skip
        minimum = sum((j.size for j in self.running()), Amount())
        # The true demand ahead: expected need and reservation are one here.
        inputs = QuotaInputs(self.capacity, lead, lead, Amount(), minimum)
        decision = next_quota(inputs, self.quota, self.grown_at, t, self.config)
        if self.quota is None or not decision.quota.fits_in(self.quota):
            self.grown_at = t
        self.quota = decision.quota
        return now_need, lead

    def evict_and_admit(self, t: float, quota: Amount) -> Amount:
        """Kueue's evictions (in its order), then its admissions; what is admitted after."""
        running = self.running()
        by_name = {j.name: j for j in running}
        for name in to_deactivate([j.admitted() for j in running], quota):
            job = by_name[name]
            self.result.preemptions += 1
            self.result.lost_work += job.done - job.checkpointed
            job.done = job.checkpointed
            job.admitted_at = None
        used = sum((j.size for j in self.running()), Amount())
        pending = [j for j in self.jobs if j.admitted_at is None and j.arrival <= t]
        for job in sorted(pending, key=lambda j: (-j.priority, j.arrival, j.name)):
            if (used + job.size).fits_in(quota):
                job.admitted_at = t
                used = used + job.size
        return used

    def progress(self, t: float, step: float) -> None:
        exponent = self.scenario.training.speedup_exponent
        restart = self.scenario.training.restart_cost_s
        for job in self.running():
            assert job.admitted_at is not None
            productive = t + step - max(t, job.admitted_at + job.startup_s + restart)
            if productive <= 0:
                continue
            gained = job.trainers**exponent * min(productive, step)
            if job.work is not None and job.done + gained >= job.work:
                gained = job.work - job.done
                job.finished_at = t + step
                self.result.jobs_finished += 1
            job.done += gained
            self.result.training_work += gained
            if self.checkpoint_s > 0 and math.floor((t + step) / self.checkpoint_s) > (
                math.floor(t / self.checkpoint_s)
            ):
                job.checkpointed = job.done


def run_kueue(
    scenario: Scenario,
    profiles: Sequence[RateProfile],
    *,
    lead_s: float = DEFAULT_LEAD_S,
    checkpoint_s: float = DEFAULT_CHECKPOINT_S,
    config: QuotaConfig | None = None,
) -> KueueResult:
    run = _KueueRun(
        scenario,
        profiles,
        lead_s,
        checkpoint_s,
        config or QuotaConfig(),
        _jobs(scenario),
        _capacity(scenario),
    )
    step = scenario.plan_interval_s
    used_cpu = 0.0
    t = 0.0
    while t < scenario.duration_s:
        now_need, lead = run.lend(t)
        assert run.quota is not None
        used = run.evict_and_admit(t, run.quota)
        run.progress(t, step)
        if used.cpu + now_need.cpu > run.capacity.cpu + 1e-9:
            run.result.serving_starved_minutes += step / 60.0
        used_cpu += used.cpu * step
        run.result.series.append(
            {"t": t, "quota": run.quota.cpu, "serving": now_need.cpu, "lead": lead.cpu,
             "admitted": used.cpu}
        )  # fmt: skip
        t += step
    capacity_cpu = max(run.capacity.cpu, 1e-9)
    run.result.training_cpu_share = used_cpu / (scenario.duration_s * capacity_cpu)
    return run.result

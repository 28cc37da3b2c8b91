"""Applying one scale command: screen it, decide, claim it, write it, record it.

The per-target record in NATS KV (bucket `EXECUTOR_RECORDS_BUCKET`, events/buckets.py) makes
commands idempotent across restarts and across several executors sharing one durable consumer:

1. read the record (and its revision) and the target's current scale;
2. a replay or a stale command ends here as a no-op;
3. claim the target by writing the command's record with `applied=False`, by compare-and-set
   on the revision read, so two executors cannot both take on commands for one target;
4. write the new scale (the port re-reads and retries on 409 Conflict);
5. mark the record `applied=True`.

If the process dies between 4 and 5, the command is redelivered, its own unfinished claim
does not stop it, and the port finds the target already at the wanted count: nothing is
written twice. The caller publishes the result, then acks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prometheus_client import Counter, Histogram

from tideshift.events import ScaleCommand, ScaleResult, encode_token
from tideshift.services.cluster.core.autoscalers import (
    FREE,
    Autoscaler,
    Bounds,
    Verdict,
    steer_message,
    steered_bounds,
)
from tideshift.services.cluster.port import ScaleState, UnsupportedTarget, WorkloadRef
from tideshift.services.common.bus import KVConflict, TypedKV
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now
from tideshift.services.executor.core.decision import (
    Admission,
    AppliedRecord,
    Decision,
    clamp_issued_at,
    decide,
    screen,
)
from tideshift.services.executor.core.fight import FightPolicy, FightRecord, Judgement, judge, wrote

log = logging.getLogger("tideshift.executor")

Outcome = Literal["applied", "noop", "rejected", "failed", "would_scale"]
CLAIM_ATTEMPTS = 5
EVENTS = Counter(
    "tideshift_executor_events_total",
    "Kubernetes Events on scale targets, by reason and whether they were written",
    ["reason", "written"],
)
# Where a command's time goes (`tideshift_executor_seconds` is the whole of it): reading the
# target, the record, the claim, the scale-down marks, the write, the applied mark, the Event.
PHASES = Histogram(
    "tideshift_executor_phase_seconds",
    "Time in each step of applying one command",
    ["phase"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


FIGHTS = Counter(
    "tideshift_executor_fights_total",
    "Targets held because another writer changed their replicas against the plan too often",
)
HELD = Counter(
    "tideshift_executor_held_commands_total",
    "Commands not written because their target is held in a fight with another writer",
)
OVERRIDES = Counter(
    "tideshift_executor_overrides_total",
    "Times a target was found changed by another writer since Tideshift last wrote it",
)

YIELDED = Counter(
    "tideshift_executor_yielded_commands_total",
    "Commands not written because another autoscaler (an HPA, a KEDA ScaledObject) writes "
    "their target's replicas",
)
STEERED = Counter(
    "tideshift_executor_steered_total",
    "Commands carried out by writing another autoscaler's bounds instead of replicas",
)

REFUSED_REASON = "TideshiftRefused"  # a command for a target that did not join Tideshift
FAILED_REASON = "TideshiftScaleFailed"  # a command the cluster would not carry out
SCALED_REASON = "TideshiftScaled"  # Normal: the count written, and the plan's reason
WOULD_SCALE_REASON = "TideshiftWouldScale"  # Normal, observe mode: what it would have written
FIGHT_REASON = "TideshiftFight"  # Warning: another writer keeps undoing the plan; held
RESUMED_REASON = "TideshiftResumed"  # Normal: the other writer went quiet; writing again
HELD_PREFIX = "held in a fight"  # how a held command's result message begins
# Warning: a command not written because another autoscaler writes the target's replicas.
LEFT_TO_AUTOSCALER_REASON = "TideshiftLeftToAutoscaler"
STEERED_REASON = "TideshiftSteered"  # Normal: another autoscaler's bounds written


class EventRecorder(Protocol):
    async def record_event(
        self,
        target: WorkloadRef,
        *,
        reason: str,
        message: str,
        event_type: Literal["Normal", "Warning"] = "Warning",
    ) -> None:
        """An Event on the target (repeats of a reason within a window raise its count)."""
        ...


def scale_message(state: ScaleState, new: int, command: ScaleCommand, decision: Decision) -> str:
    """An Event's words: `18 -> 24: <the plan's reason>`, a training job's in trainers
    (`-4 trainers (10 -> 6): ...`), then what the executor changed of the command, if any."""
    old = state.replicas
    change = (
        f"{new - old:+d} trainers ({old} -> {new})"
        if state.role == "training"
        else (f"{old} -> {new}")
    )
    notes = f" ({decision.message})" if decision.message else ""
    return f"{change}: {command.reason}{notes}"


class ScaleWriter(Protocol):
    """A target's scale, read and written: all the executor asks of a cluster for a command."""

    async def get_scale(self, target: WorkloadRef) -> ScaleState:
        """Raises KeyError when the target does not exist, UnsupportedTarget for its kind,
        ClusterError when the cluster cannot answer."""
        ...

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        """Sets the target's desired replicas (clamped to its own bounds); returns the result.
        Raises as `get_scale` does."""
        ...


def record_key(target: WorkloadRef) -> str:
    return ".".join(encode_token(part) for part in (target.namespace, target.kind, target.name))


def fight_key(target: WorkloadRef) -> str:
    """The target's fight record, in the records' bucket (four tokens: never a record's key)."""
    return f"fight.{record_key(target)}"


class FightStore(Protocol):
    """Each target's FightRecord, shared by every executor."""

    async def get(self, target: WorkloadRef) -> FightRecord: ...

    async def put(self, target: WorkloadRef, record: FightRecord) -> None: ...


class KVFightStore:
    """FightRecords in the records' KV bucket; `tideshift scale --resume` deletes one."""

    def __init__(self, kv: TypedKV) -> None:
        self.kv = kv

    async def get(self, target: WorkloadRef) -> FightRecord:
        return await self.kv.get(fight_key(target), FightRecord) or FightRecord()

    async def put(self, target: WorkloadRef, record: FightRecord) -> None:
        if record == FightRecord():
            await self.kv.delete(fight_key(target))
        else:
            await self.kv.put(fight_key(target), record)


@dataclass
class MemoryFightStore:
    """FightRecords in this process (tests, the demo)."""

    kept: dict[WorkloadRef, FightRecord] = field(default_factory=dict)

    async def get(self, target: WorkloadRef) -> FightRecord:
        return self.kept.get(target, FightRecord())

    async def put(self, target: WorkloadRef, record: FightRecord) -> None:
        self.kept[target] = record


class OtherAutoscalers(Protocol):
    """HPAs and KEDA ScaledObjects on a target: found, and steered."""

    async def verdict(self, target: WorkloadRef) -> Verdict:
        """Whether another autoscaler targets `target`, and whether to yield or steer."""
        ...

    async def steer(self, autoscaler: Autoscaler, bounds: Bounds) -> None:
        """Write the autoscaler's bounds; KeyError when it is gone."""
        ...


class RecordStore:
    """AppliedRecords in a KV bucket, written by compare-and-set on the revision read."""

    def __init__(self, kv: TypedKV) -> None:
        self.kv = kv

    async def get(self, target: WorkloadRef) -> tuple[AppliedRecord | None, int | None]:
        """The record and its revision; an unreadable record reads as absent (and is logged)."""
        return await self.kv.get_revision(record_key(target), AppliedRecord)

    async def put(
        self, target: WorkloadRef, record: AppliedRecord, revision: int | None
    ) -> int | None:
        """The new revision, or None if someone else wrote since `revision`."""
        try:
            return await self.kv.update(record_key(target), record, revision=revision)
        except KVConflict:
            return None


class Transient(Exception):
    """Worth retrying later (apiserver unreachable, lost the claim race repeatedly...)."""


@dataclass
class Executor:
    port: ScaleWriter
    records: RecordStore
    name: str = "executor"
    max_step: int = 0
    dry_run: bool = False
    # Observe mode: nothing is written; each command that would change a target leaves a
    # TideshiftWouldScale Event and a `would_scale` result (dry_run leaves neither).
    observe: bool = False
    clock: Clock = WALL_CLOCK
    admission: Admission = field(default_factory=Admission)
    # Where the target's owner is told what was done, refused or failed (none: logs only).
    events: EventRecorder | None = None
    # Runs before replicas are lowered (target, new count): marks the pods to delete first.
    before_scale_down: Callable[[WorkloadRef, int], Awaitable[object]] | None = None
    # Where fights with other writers are tracked (none: never detected, always written).
    fights: FightStore | None = None
    fight_policy: FightPolicy = field(default_factory=FightPolicy)
    # Where other autoscalers on a target are looked for before a write (none: not looked
    # for): Tideshift yields to them, or steers their bounds (`cluster.core.autoscalers`).
    autoscalers: OtherAutoscalers | None = None

    def result_for(
        self,
        command: ScaleCommand,
        outcome: Outcome,
        *,
        previous: int | None = None,
        current: int | None = None,
        message: str = "",
        dry_run: bool = False,
    ) -> ScaleResult:
        return ScaleResult(
            target=command.target,
            idempotency_key=command.idempotency_key,
            outcome=outcome,
            previous=previous,
            current=current,
            desired=command.desired,
            message=message[:2000],
            dry_run=dry_run,
            executed_at=utc_now(self.clock),
            executor=self.name,
        )

    async def handle(self, command: ScaleCommand) -> ScaleResult:
        """The result of one command. Raises Transient (retry later) or the port's errors."""
        for _ in range(CLAIM_ATTEMPTS):
            result = await self._attempt(command)
            if result is not None:
                return result
            # another executor recorded a command meanwhile: screen again
        raise Transient(f"lost the claim on {command.target} {CLAIM_ATTEMPTS} times")

    async def _attempt(self, command: ScaleCommand) -> ScaleResult | None:
        """Screen, decide, claim and apply once; None when the claim was lost to a rival."""
        target = command.target
        state = await self._admitted_state(command)
        if isinstance(state, ScaleResult):
            return state
        with PHASES.labels("record_read").time():
            record, revision = await self.records.get(target)
        why_not = screen(
            idempotency_key=command.idempotency_key, issued_at=command.issued_at, record=record
        )
        if why_not is not None:
            return self._unchanged(command, state, why_not)
        decision = decide(command.desired, state, max_step=self.max_step)
        other = await self.autoscalers.verdict(target) if self.autoscalers else FREE
        if other.action == "steer" or (other.action == "yield" and decision.action != "noop"):
            return await self._leave_replicas(command, state, other, revision)
        if self.observe or self.dry_run:
            return await self._unwritten(command, state, decision)
        # Read before the claim, like the applied record: between the claim and the write the
        # bus sees the fight record only when it changed (an override, a hold, a resume).
        fought = await self._fight_record(target) if decision.action != "noop" else None
        claim = AppliedRecord(
            idempotency_key=command.idempotency_key,
            issued_at=clamp_issued_at(command.issued_at, utc_now(self.clock)),
            desired=command.desired,
            applied=decision.action == "noop",
        )
        with PHASES.labels("claim").time():
            claimed = await self.records.put(target, claim, revision)
        if claimed is None:
            return None
        if decision.action == "noop":
            return self._unchanged(command, state, decision.message)
        fight = await self._judge_fight(command, state, fought)
        if isinstance(fight, ScaleResult):
            return fight
        return await self._apply(
            command, state, decision, claim=claim, claimed=claimed, fight=fight
        )

    async def _leave_replicas(
        self, command: ScaleCommand, state: ScaleState, other: Verdict, revision: int | None
    ) -> ScaleResult | None:
        """Another autoscaler writes the target's replicas: steer its bounds, or yield."""
        if other.action == "steer":
            return await self._steer(command, state, other, revision)
        return await self._yield(command, state, other)

    async def _yield(self, command: ScaleCommand, state: ScaleState, other: Verdict) -> ScaleResult:
        """The rejection of a command whose target another autoscaler scales (no claim: a
        replay is screened again, and written once that autoscaler is gone)."""
        YIELDED.inc()
        log.info("%s: %s", command.target, other.reason)
        await self.warn(command.target, LEFT_TO_AUTOSCALER_REASON, other.reason)
        return self.result_for(
            command,
            "rejected",
            previous=state.replicas,
            current=state.replicas,
            message=other.reason,
        )

    async def _steer(
        self, command: ScaleCommand, state: ScaleState, other: Verdict, revision: int | None
    ) -> ScaleResult | None:
        """Carry the command out on the autoscaler's bounds, never on replicas: the plan's
        count becomes its minimum (`steered_bounds`); claimed and recorded like a write."""
        autoscaler = other.autoscaler
        assert autoscaler is not None and self.autoscalers is not None
        target = command.target
        bounds = steered_bounds(autoscaler, needed=command.desired, user_max=other.user_max)
        words = steer_message(autoscaler, bounds)
        if bounds == Bounds(autoscaler.min_replicas, autoscaler.max_replicas):
            return self._unchanged(command, state, f"{autoscaler} already steered: {words}")
        if self.observe or self.dry_run:
            label = "observe mode" if self.observe else "dry run"
            if self.observe:
                await self._tell(target, WOULD_SCALE_REASON, f"would steer {words}", "Normal")
            return self.result_for(
                command,
                "would_scale" if self.observe else "applied",
                previous=state.replicas,
                current=state.replicas,
                message=f"{label}: would steer {words}",
                dry_run=True,
            )
        claim = AppliedRecord(
            idempotency_key=command.idempotency_key,
            issued_at=clamp_issued_at(command.issued_at, utc_now(self.clock)),
            desired=command.desired,
            applied=False,
        )
        with PHASES.labels("claim").time():
            claimed = await self.records.put(target, claim, revision)
        if claimed is None:
            return None
        try:
            with PHASES.labels("write").time():
                await self.autoscalers.steer(autoscaler, bounds)
        except KeyError:
            return self.result_for(command, "rejected", message=f"{autoscaler} not found")
        with PHASES.labels("mark_applied").time():
            await self.records.put(target, claim.model_copy(update={"applied": True}), claimed)
        STEERED.inc()
        await self._tell(target, STEERED_REASON, f"steered {words}: {command.reason}", "Normal")
        return self.result_for(
            command,
            "applied",
            previous=state.replicas,
            current=state.replicas,
            message=f"steered {words}",
        )

    async def _fight_record(self, target: WorkloadRef) -> FightRecord | None:
        """The target's fight record (None: fights are not tracked)."""
        if self.fights is None:
            return None
        with PHASES.labels("fight").time():
            return await self.fights.get(target)

    async def _judge_fight(
        self, command: ScaleCommand, state: ScaleState, record: FightRecord | None
    ) -> ScaleResult | FightRecord | None:
        """The result of a command not written because its target is in a fight, or the
        target's fight record to go ahead with (None: fights are not tracked). A fight's
        start and end leave an Event on the target."""
        if record is None:
            return None
        target = command.target
        now = self.clock.now()
        judgement = judge(record, seen=state.replicas, now=now, policy=self.fight_policy)
        await self._keep_fight(target, record, judgement)
        if judgement.writes:
            return judgement.record
        HELD.inc()
        # The claim stays unapplied: a replay of this command is screened again, not skipped.
        return self.result_for(
            command,
            "rejected",
            previous=state.replicas,
            current=state.replicas,
            message=f"{HELD_PREFIX}: {judgement.message}",
        )

    async def _keep_fight(
        self, target: WorkloadRef, before: FightRecord, judgement: Judgement
    ) -> None:
        """Store the fight record when it changed; tell the owner of a hold or a resume."""
        after = judgement.record
        if judgement.overridden:
            OVERRIDES.inc()
        if after != before and self.fights is not None:
            await self.fights.put(target, after)
        if judgement.verdict == "hold":
            FIGHTS.inc()
            log.warning("%s: %s", target, judgement.message)
            await self.warn(target, FIGHT_REASON, judgement.message)
        elif judgement.verdict == "resume":
            log.info("%s: %s", target, judgement.message)
            await self._tell(target, RESUMED_REASON, judgement.message, "Normal")

    async def _admitted_state(self, command: ScaleCommand) -> ScaleState | ScaleResult:
        """The target's scale, or the rejection of a command the executor must not act on."""
        target = command.target
        # Refused before any read: a command for a namespace outside the allowed ones costs
        # neither an apiserver request nor a record.
        refusal = self.admission.refuse_namespace(target)
        if refusal is not None:
            return self.result_for(command, "rejected", message=refusal)
        try:
            with PHASES.labels("read").time():
                state = await self.port.get_scale(target)
        except UnsupportedTarget as error:
            return self.result_for(command, "rejected", message=str(error))
        except KeyError:
            return self.result_for(command, "rejected", message=f"{target} not found")
        refusal = self.admission.refuse(state)
        if refusal is not None:
            await self.warn(target, REFUSED_REASON, refusal)
            return self.result_for(command, "rejected", message=refusal)
        return state

    async def warn(self, target: WorkloadRef, reason: str, message: str) -> None:
        """A Warning Event on the target."""
        await self._tell(target, reason, message, "Warning")

    async def _tell(
        self,
        target: WorkloadRef,
        reason: str,
        message: str,
        event_type: Literal["Normal", "Warning"],
    ) -> None:
        """An Event on the target; failing to write it costs a log line, not the command."""
        if self.events is None:
            return
        try:
            with PHASES.labels("event").time():
                await self.events.record_event(
                    target, reason=reason, message=message, event_type=event_type
                )
        except Exception as error:
            EVENTS.labels(reason, "false").inc()
            log.warning("cannot record an event on %s: %s", target, error)
            return
        EVENTS.labels(reason, "true").inc()

    def _unchanged(self, command: ScaleCommand, state: ScaleState, message: str) -> ScaleResult:
        return self.result_for(
            command, "noop", previous=state.replicas, current=state.replicas, message=message
        )

    async def _unwritten(
        self, command: ScaleCommand, state: ScaleState, decision: Decision
    ) -> ScaleResult:
        """Observe mode and dry run write nothing; the result says what would have been
        written. Observe mode also tells the target (a TideshiftWouldScale Event) and reports
        `would_scale`, where a dry run reports `applied`."""
        label = "observe mode" if self.observe else "dry run"
        outcome: Outcome = "would_scale" if self.observe else "applied"
        if decision.action == "noop":
            outcome = "noop"
        elif self.observe:
            words = scale_message(state, decision.replicas, command, decision)
            await self._tell(command.target, WOULD_SCALE_REASON, f"would scale {words}", "Normal")
        return self.result_for(
            command,
            outcome,
            previous=state.replicas,
            current=decision.replicas,
            message=f"{label}: would set {decision.replicas}; {decision.message}".rstrip("; "),
            dry_run=True,
        )

    async def _apply(
        self,
        command: ScaleCommand,
        state: ScaleState,
        decision: Decision,
        *,
        claim: AppliedRecord,
        claimed: int,
        fight: FightRecord | None = None,
    ) -> ScaleResult:
        """Write the claimed scale, then mark the claim applied (and, when fights are
        tracked, remember the count written: a change from it is another writer's)."""
        target = command.target
        if self.before_scale_down is not None and decision.replicas < state.replicas:
            with PHASES.labels("scale_down_marks").time():
                await self.before_scale_down(target, decision.replicas)
        try:
            with PHASES.labels("write").time():
                after = await self.port.set_scale(target, decision.replicas)
        except KeyError:
            return self.result_for(command, "rejected", message=f"{target} not found")
        if self.fights is not None and fight is not None and fight.written != after.replicas:
            await self.fights.put(target, wrote(fight, after.replicas))
        done = claim.model_copy(update={"applied": True})
        with PHASES.labels("mark_applied").time():
            recorded = await self.records.put(target, done, claimed)
        if recorded is None:
            log.info("record of %s changed while applying %s", target, command.idempotency_key)
        final: Outcome = "applied" if after.replicas != state.replicas else "noop"
        if final == "applied":
            words = scale_message(state, after.replicas, command, decision)
            await self._tell(target, SCALED_REASON, words, "Normal")
        return self.result_for(
            command,
            final,
            previous=state.replicas,
            current=after.replicas,
            message=decision.message,
        )

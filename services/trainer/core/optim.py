"""The optimisers a pserver applies: SGD, momentum, Adagrad and Adam, dense or by rows.

A job's spec names one optimiser with its hyper-parameters; each pserver keeps the slots
(velocity, accumulators, moments) next to its pieces. Sparse updates touch only the given
rows (Adam's moments decay lazily, as Paddle's `lazy_mode` does), so a batch that reads ten
rows of a large embedding table costs ten rows. Updates work in place on the pserver's own
arrays. Pure: numpy and pydantic only.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

Array = npt.NDArray[Any]


class GradientRejected(ValueError):
    """A gradient that must not touch the parameters; the message says why."""


class OptimizerSpec(BaseModel):
    """`{"kind": "adam", "learning_rate": 0.01}`; unset hyper-parameters take the defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sgd", "momentum", "adagrad", "adam"] = "adagrad"
    learning_rate: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    momentum: float = Field(default=0.9, ge=0, lt=1, description="momentum only")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="adam only")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="adam only")
    epsilon: float = Field(default=1e-8, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False, description="L2")

    @property
    def slot_names(self) -> tuple[str, ...]:
        return {
            "sgd": (),
            "momentum": ("velocity",),
            "adagrad": ("accumulator",),
            "adam": ("moment1", "moment2"),
        }[self.kind]


def new_slots(spec: OptimizerSpec, params: Array) -> dict[str, Array]:
    return {name: np.zeros_like(params) for name in spec.slot_names}


def _check(gradient: Array, shape: tuple[int, ...], what: str) -> None:
    if gradient.shape != shape:
        raise GradientRejected(f"{what}: expected shape {shape}, got {gradient.shape}")
    if not np.issubdtype(gradient.dtype, np.floating):
        raise GradientRejected(f"{what}: expected floats, got {gradient.dtype}")
    if not np.all(np.isfinite(gradient)):
        raise GradientRejected(f"{what}: non-finite values")


def _step(
    spec: OptimizerSpec,
    params: Array,
    slots: dict[str, Array],
    gradient: Array,
    step_count: int,
) -> tuple[Array, dict[str, Array]]:
    """New values of `params` and slots (same shapes as `gradient`) after one step."""
    if spec.weight_decay:
        gradient = gradient + spec.weight_decay * params
    rate = spec.learning_rate
    if spec.kind == "sgd":
        return params - rate * gradient, {}
    if spec.kind == "momentum":
        velocity = spec.momentum * slots["velocity"] + gradient
        return params - rate * velocity, {"velocity": velocity}
    if spec.kind == "adagrad":
        accumulator = slots["accumulator"] + gradient * gradient
        return params - rate * gradient / (np.sqrt(accumulator) + spec.epsilon), {
            "accumulator": accumulator
        }
    moment1 = spec.beta1 * slots["moment1"] + (1 - spec.beta1) * gradient
    moment2 = spec.beta2 * slots["moment2"] + (1 - spec.beta2) * gradient * gradient
    corrected1 = moment1 / (1 - spec.beta1**step_count)
    corrected2 = moment2 / (1 - spec.beta2**step_count)
    return params - rate * corrected1 / (np.sqrt(corrected2) + spec.epsilon), {
        "moment1": moment1,
        "moment2": moment2,
    }


def check_dense(params: Array, gradient: Array, what: str) -> None:
    _check(gradient, params.shape, what)


def check_rows(params: Array, indices: Array, rows: Array, what: str) -> None:
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        raise GradientRejected(f"{what}: indices must be a 1-d integer array")
    _check(rows, (indices.shape[0], *params.shape[1:]), f"{what} rows")
    if indices.size and (indices.min() < 0 or indices.max() >= params.shape[0]):
        raise GradientRejected(
            f"{what}: indices must be in [0, {params.shape[0]}), "
            f"got [{indices.min()}, {indices.max()}]"
        )


def apply_dense(
    spec: OptimizerSpec, params: Array, slots: dict[str, Array], gradient: Array, step_count: int
) -> None:
    """One step over every row, in place; call `check_dense` first."""
    new_params, new_slots = _step(spec, params, slots, gradient.astype(params.dtype), step_count)
    params[...] = new_params
    for name, value in new_slots.items():
        slots[name][...] = value


def apply_rows(  # noqa: PLR0917 - the dense and sparse steps take the same arguments
    spec: OptimizerSpec,
    params: Array,
    slots: dict[str, Array],
    indices: Array,
    rows: Array,
    step_count: int,
) -> None:
    """One step over the given rows only (repeated indices are summed), in place."""
    if indices.size == 0:
        return
    order = np.argsort(indices, kind="stable")
    unique, starts = np.unique(indices[order], return_index=True)
    summed = np.add.reduceat(rows[order].astype(params.dtype), starts, axis=0)
    touched = {name: slot[unique] for name, slot in slots.items()}
    new_params, new_slots = _step(spec, params[unique], touched, summed, step_count)
    params[unique] = new_params
    for name, value in new_slots.items():
        slots[name][unique] = value

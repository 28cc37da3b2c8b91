"""No job left behind (issue 39, item 4): the modelled fair share `simulate` counts a job at
zero trainers against (services/simulator/core/fair_share.py)."""

from __future__ import annotations

import numpy as np

from tideshift.services.simulator.core.fair_share import ShareJob, fair_shares, positive

GIB = 2.0**30
CPU_NODES = [(16.0, 64 * GIB, 0.0)] * 24
GPU_NODES = [(32.0, 128 * GIB, 4.0)] * 4
NODES = np.array(CPU_NODES + GPU_NODES)
CPU_JOB = ShareJob((2.0, 4 * GIB, 0.0), gang=2, most=200)
GPU_JOB = ShareJob((4.0, 16 * GIB, 1.0), gang=2, most=16, weight=2.0)


def test_shares_fill_the_room_dominant_resource_fair() -> None:
    room = NODES.sum(axis=0) - np.array([300.0, 600 * GIB, 0.0])  # serving holds 300 cores
    cpu, gpu = fair_shares([CPU_JOB, GPU_JOB], NODES, room)
    # All 212 cores are shared out, the GPU job never beyond the 16 GPUs.
    assert cpu * 2 + gpu * 4 == 212
    assert 0 < gpu <= 16
    assert positive([CPU_JOB, GPU_JOB], [cpu, gpu]) == [True, True]


def test_a_job_reaches_only_the_nodes_its_trainer_fits_on() -> None:
    # Serving needs every core but 20: the GPU job's share is of the GPU nodes' room alone.
    room = NODES.sum(axis=0) - np.array([492.0, 0.0, 0.0])
    big = ShareJob((40.0, 4 * GIB, 0.0), gang=1, most=4)  # fits on no node
    shares = fair_shares([CPU_JOB, GPU_JOB, big], NODES, room)
    assert shares[2] == 0
    assert shares[0] * 2 + shares[1] * 4 <= 20


def test_a_share_below_the_gang_runs_nothing() -> None:
    room = np.array([6.0, 1000 * GIB, 16.0])
    shares = fair_shares([CPU_JOB, GPU_JOB], NODES, room)
    assert positive([CPU_JOB, GPU_JOB], shares) == [share >= 2 for share in shares]
    assert not all(positive([CPU_JOB, GPU_JOB], shares))  # 6 cores: not two gangs of both


def test_higher_tiers_are_served_first() -> None:
    room = np.array([40.0, 1000 * GIB, 0.0])
    high = ShareJob((2.0, 4 * GIB, 0.0), gang=2, most=20, priority=1)
    low = ShareJob((2.0, 4 * GIB, 0.0), gang=2, most=20)
    assert fair_shares([low, high], NODES, room) == [0, 20]


def test_no_room_no_share() -> None:
    assert fair_shares([CPU_JOB], NODES, np.array([-5.0, 0.0, 0.0])) == [0]
    assert fair_shares([], NODES, NODES.sum(axis=0)) == []

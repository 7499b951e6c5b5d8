"""The capacity model's simulator (bench/capacity_model.py, issue 24 item 5) against queueing
theory it must agree with: the mean wait of an M/G/1 queue is Pollaczek-Khinchine's,
λ·E[S²] / (2·(1 − ρ)) with E[S²] = (1 + cv²)·mean², for any service-time distribution; and the
pool it sizes is never over its utilisation cap and meets its wait target."""

from __future__ import annotations

import random

import pytest

from bench import capacity_model as cm


@pytest.mark.parametrize(("rho", "cv"), [(0.5, 0.5), (0.7, 1.0), (0.8, 0.3)])
def test_one_slot_mean_wait_is_pollaczek_khinchine(rho: float, cv: float) -> None:
    mean = 0.2
    rate = rho / mean
    expected = rate * (1 + cv * cv) * mean * mean / (2 * (1 - rho))
    _, simulated = cm.simulate(rate, mean, cv, 1, 400_000, random.Random(7))
    assert simulated == pytest.approx(expected, rel=0.08)


def test_more_slots_at_the_same_load_wait_less() -> None:
    waits = [cm.simulate(0.8 * c / 0.1, 0.1, 1.0, c, 100_000, random.Random(3))[1] for c in (1, 4, 16)]
    assert waits[0] > waits[1] > waits[2] > 0


def test_a_sized_pool_keeps_its_cap_and_its_target() -> None:
    images = cm.CLASSES[0]
    pool = cm.size_pool(images, 500.0, seed=1)
    assert pool.busy_cores == pytest.approx(500.0 * images.engine_cpu_seconds.value)
    assert pool.busy_cores / pool.slots <= cm.MAX_UTILISATION.value
    assert pool.p95_wait <= images.wait_target_seconds.value
    assert pool.pods == -(-pool.slots // int(cm.POD_CORES.value))

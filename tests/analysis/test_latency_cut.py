"""The cut bound with latency windows (collc.analysis.latency_cut)."""

from __future__ import annotations

import numpy as np
import pytest

from collc.analysis.bounds import lower_bounds
from collc.analysis.latency_cut import multicast_window_bound, window_bound
from collc.ir.collective import allgather
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions
from analysis_nets import ring, star

US = 1e-6


def test_window_bound_by_hand():
    # Two links of 1 byte/s, open from 0 and from 2: 4 bytes need T with T + (T - 2) = 4.
    assert window_bound(np.array([1.0, 1.0]), np.array([0.0, 2.0]), 4.0) == pytest.approx(3.0)
    # A link opening after the others have finished adds nothing.
    assert window_bound(np.array([1.0, 1.0]), np.array([0.0, 10.0]), 4.0) == pytest.approx(4.0)
    assert window_bound(np.array([1.0]), np.array([5.0]), 0.0) == 0.0


def test_multicast_window_bound_by_hand():
    # Two links of 1 byte/s; a byte leaving once needs the window T - 2, one leaving
    # twice two windows of T: carried(T) = 2 (T - 2) + (2T - 2 (T - 2)) / 2 = 2T - 2.
    assert multicast_window_bound(np.array([1.0, 1.0]), np.zeros(2), np.full(2, 2.0), 4.0) == pytest.approx(3.0)
    # Equal windows: every byte leaves once, as in window_bound.
    assert multicast_window_bound(np.array([1.0]), np.zeros(1), np.zeros(1), 4.0) == pytest.approx(4.0)


def test_is_the_cut_plus_the_path_latency_on_a_switch():
    topo = star(4)  # 10 GB/s, 1 us per link: a route is 2 us
    b = lower_bounds(topo, allgather(4), 4 << 20)
    assert b.cut_latency_s == pytest.approx(b.cut_s + 2 * US, rel=1e-9)
    assert b.with_latency_s >= b.best_s


@pytest.mark.parametrize("size", [4 << 10, 64 << 10, 1 << 20])
def test_no_synthesized_schedule_beats_it(size):
    for topo in (ring(4), star(4)):
        coll = allgather(4)
        result = synthesize(topo, coll, size, SynthesisOptions(progress=False))
        assert result.estimate_s >= lower_bounds(topo, coll, size).cut_latency_s * (1 - 1e-9)

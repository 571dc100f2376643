"""The cut bound with latency windows (collc.analysis.latency_cut)."""

from __future__ import annotations

import numpy as np
import pytest

from collc.analysis.bounds import lower_bounds
from collc.analysis.latency_cut import Crossing, latency_cut_bound, multicast_window_bound, window_bound
from collc.ir import Topology
from collc.ir.collective import allgather, standard
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions
from analysis_nets import build, ring, star, two_groups

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


def test_late_bytes_are_capped_by_what_can_enter_each_needer_late():
    # Two links of 1 byte/s, as above, whose late copies (the last 2 s of their twice
    # windows) may carry 2 bytes at most: carried(T) = 2 (T - 2) + min(2, 2) = 2T - 2 ...
    assert multicast_window_bound(np.ones(2), np.zeros(2), np.full(2, 2.0), 4.0, 2.0) == pytest.approx(3.0)
    # ... and 1 byte: 2 (T - 2) + 1 = 4 at T = 3.5.
    assert multicast_window_bound(np.ones(2), np.zeros(2), np.full(2, 2.0), 4.0, 1.0) == pytest.approx(3.5)


def _fork(thin: float) -> Topology:
    """GPU s sends to GPUs a and b (1 us apart) through two 1 GB/s links into a switch
    w, which reaches a and b over links of `thin` bytes/s (every link 1 us)."""
    return build("fork", ["s", "a", "b"], ["p", "q", "w"],
                 [("s", "p", 1e9), ("s", "q", 1e9), ("p", "w", 1e9), ("q", "w", 1e9), ("w", "a", thin),
                  ("w", "b", thin), ("a", "b", 100e9)], directed=True)


def test_late_entry_by_hand():
    # S = {s, p, q}: the links p -> w and q -> w leave it, 3 us from a needer, 4 us from
    # both (through a). A byte leaving at t > T - 4 must reach a and b each straight from
    # w over its thin link, which it enters after T - 3 (at w after t + 1) and must leave
    # by T - 2 (1 us more to the GPU): 1 us of each thin link.
    crossing = [Crossing(("s",), ("a", "b"))]
    wide = latency_cut_bound(_fork(100e9), {"s", "p", "q"}, 10e3, crossing)
    # Thin links wide enough: late copies are limited by the leaving links' twice
    # windows, (T - 3) x 1 GB/s each, beyond the once windows (T - 4): carried(T) =
    # 2 (T - 4) + (2 x 1) / 2 = 2T - 7 in GB/s x us: 10 KB at T = 8.5 us.
    assert wide == pytest.approx(8.5e-6, rel=1e-9)
    # Thin links of 0.1 GB/s let 0.1 KB in late: 2 (T - 4) + 0.1 = 10 at T = 8.95 us.
    thin = latency_cut_bound(_fork(0.1e9), {"s", "p", "q"}, 10e3, crossing)
    assert thin == pytest.approx(8.95e-6, rel=1e-9)


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


@pytest.mark.parametrize("size", [4 << 10, 1 << 20])
def test_no_synthesized_broadcast_beats_it(size):
    # Multicasts out of a set (the root's chunk to two or more GPUs), where late entry counts.
    for topo in (two_groups(), star(4)):
        coll = standard("broadcast", 4, 1, 0)
        result = synthesize(topo, coll, size, SynthesisOptions(progress=False))
        assert result.estimate_s >= lower_bounds(topo, coll, size).cut_latency_s * (1 - 1e-9)

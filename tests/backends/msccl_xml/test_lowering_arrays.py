"""The lowering's integer and array forms decide exactly as the plain rules they replace.

The channel table weighs a long chain against every channel at once (numpy), a short one
channel by channel, and falls back to the exact peer test only where counting all new peers says no; halves carry integer
places instead of keys; msccl-merge keeps the ops it does not change. Each test compares
with the rule written out plainly, or checks the property the shortcut relies on.
"""

from __future__ import annotations

import random
from collections import Counter

import msccl_xml_schedules as ms
from hypothesis import given, settings
from hypothesis import strategies as st

from collc.backends.msccl_xml.channels import MAX_TBS_PER_CHANNEL, _ChannelTable, _Uses
from collc.backends.msccl_xml.halves import split_schedule
from collc.backends.msccl_xml.merge import merge_ops
from collc.verify import verify


def _plain_best(load: list[dict], send_peers: list[dict], recv_peers: list[dict],
                uses: list[tuple[tuple[int, int], int]]) -> int:
    """The channel rule as plain Python: the lowest channel among the least loaded that
    keeps every rank within the peer limit."""
    to: dict[int, set[int]] = {}
    came: dict[int, set[int]] = {}
    for (a, b), _ in uses:
        to.setdefault(a, set()).add(b)
        came.setdefault(b, set()).add(a)
    best, best_cost = -1, -1
    for ch in range(len(load)):
        if any(len(send_peers[ch].get(a, set()) | more) > MAX_TBS_PER_CHANNEL for a, more in to.items()):
            continue
        if any(len(recv_peers[ch].get(b, set()) | more) > MAX_TBS_PER_CHANNEL for b, more in came.items()):
            continue
        cost = max(load[ch].get(conn, 0) + n for conn, n in uses)
        if best < 0 or cost < best_cost:
            best, best_cost = ch, cost
    return best


def _dense_chains(seed: int, count: int) -> list[list[tuple[int, int, int]]]:
    """Chains from a few senders to many receivers, each sender reusing most of its
    peers: the 32-peer limit is hit often, so the count test, the exact test (old peers
    do not count again) and "no channel fits" all decide."""
    rng = random.Random(seed)
    chains = []
    for _ in range(count):
        senders = rng.sample(range(4), rng.randint(1, 3))
        chains.append([(a, rng.randrange(4, _RANKS), rng.randint(1, 5))
                       for a in senders for _ in range(rng.randint(1, 12))])
    return chains


_RANKS = 44


@settings(max_examples=25, deadline=None)
@given(channels=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_channel_table_chooses_as_the_plain_rule(channels, seed):
    numbers: dict[tuple[int, int], int] = {}
    table = _ChannelTable(channels, _RANKS, _RANKS * _RANKS)
    load: list[dict] = [{} for _ in range(channels)]
    send_peers: list[dict] = [{} for _ in range(channels)]
    recv_peers: list[dict] = [{} for _ in range(channels)]
    for chain in _dense_chains(seed, 40):
        counted = Counter()
        for a, b, n in chain:
            counted[(a, b)] += n
        uses = list(counted.items())
        items = [(conn, numbers.setdefault(conn, len(numbers)), n) for conn, n in uses]
        want = _plain_best(load, send_peers, recv_peers, uses)
        assert table.best(_Uses(items)) == want
        if want < 0:
            continue
        table.add(_Uses(items), want)
        for (a, b), n in uses:
            load[want][(a, b)] = load[want].get((a, b), 0) + n
            send_peers[want].setdefault(a, set()).add(b)
            recv_peers[want].setdefault(b, set()).add(a)


@settings(max_examples=25, deadline=None)
@given(channels=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_one_connection_chains_choose_as_the_plain_rule(channels, seed):
    """Chains of one connection each (a rail ring's or AllToAll's) from two senders to
    many receivers: the senders reach the peer limit, and an old peer still fits."""
    rng = random.Random(seed)
    numbers: dict[tuple[int, int], int] = {}
    table = _ChannelTable(channels, _RANKS, _RANKS * _RANKS)
    load: list[dict] = [{} for _ in range(channels)]
    send_peers: list[dict] = [{} for _ in range(channels)]
    recv_peers: list[dict] = [{} for _ in range(channels)]
    for _ in range(150):
        a, b, n = rng.randrange(2), rng.randrange(2, _RANKS), rng.randint(1, 5)
        items = [((a, b), numbers.setdefault((a, b), len(numbers)), n)]
        want = _plain_best(load, send_peers, recv_peers, [((a, b), n)])
        assert table.best(_Uses(items)) == want
        if want < 0:
            continue
        table.add(_Uses(items), want)
        load[want][(a, b)] = load[want].get((a, b), 0) + n
        send_peers[want].setdefault(a, set()).add(b)
        recv_peers[want].setdefault(b, set()).add(a)


def test_integer_places_order_halves_as_their_keys():
    split = split_schedule(ms.random_allgather(6, 2, seed=3))
    by_key = sorted(range(len(split.halves)), key=lambda h: split.halves[h].key)
    assert [split.places[h] for h in by_key] == list(range(len(split.halves)))


def test_merge_keeps_the_ops_it_does_not_change():
    for seed in range(4):
        sched = ms.random_allgather(5, 3, seed=seed)
        merged = merge_ops(sched)
        verify(merged)
        old = {op.id: op for op in sched.ops}
        ids = {op.id for op in merged.ops}
        kept = [op for op in merged.ops if op.id in old and op == old[op.id]]
        # An op equal to its original is the original object, not a copy.
        assert kept and all(op is old[op.id] for op in kept)
        assert len(merged.ops) < len(sched.ops)
        for op in merged.ops:
            assert all(d in ids for d in op.deps)

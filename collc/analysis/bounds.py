"""Lower bounds on the completion time of a collective on a topology.

The model the bounds hold for: GPUs store and forward, and may send one slot they hold
on several links (copy, multicast); switches and NICs forward but hold, copy and
reduce nothing; a link of capacity B carries at most B x T bytes in time T; a message
is one slot moved from one GPU to another, `collective.slot_bytes(size_bytes)` bytes (nccl-tests' size over the larger buffer). Every bound
holds for every schedule in that model, whatever its routes, order and chunking, and
is derived from the collective's postcondition (collc.analysis.demand), not its name.

- ingress: a rank needs every requirement it cannot form locally; two requirements
  whose missing chunks are disjoint need distinct R-relevant messages (a message
  serving both would be a subset of both and hold a missing chunk of each). So rank v
  receives at least slot x k_v bytes over its in-links, k_v the size of a family of
  pairwise disjoint missing sets: T >= slot x k_v / B_in(v).
- egress: a chunk only rank u holds, in a requirement another rank needs, leaves u in
  an R-relevant message: T >= slot x e_u / B_out(u), e_u counted the same way.
- volume: for one requirement R with owners O and needers D (all messages counted are
  R-relevant; requirements with disjoint values never share one), serialise the
  messages and let x be the first rank to know all of R, at message t. Of the chunks
  x lacks, those with pairwise disjoint holder sets (pack_x of them) each left a
  different holder by t, and every other needer receives a message after t: at least
  pack_x + |D - {x}| messages, minimised over x (2N - 2 for AllReduce: the one-way
  gossip bound). Each message is
  received by a GPU and sent by a GPU, so T >= slot x sum / (sum of GPU in-capacity),
  and the same over out-capacity. This is the 2(N-1)/N x M / B AllReduce bound of
  symmetric topologies, and it needs no symmetry.
- grouped volume: the same count holds for any partition of the GPUs into groups,
  each group a set of nodes (its GPUs, and any switches or NICs given to it; the sets
  disjoint). Contract every group to one "super-GPU" that may hold, copy and reduce
  freely inside: a schedule maps to one of the contracted problem where messages
  inside a group vanish and a message between groups stays one message of the same
  size. Let a group know chunk c of R once a value V <= R with c in V has been held
  by one of its GPUs. Values only grow and a reduction into V <= R joins parts that
  are both <= R, so a group comes to know a chunk it did not hold at the start only
  by receiving an R-relevant message from another group, whose sender knew it. The
  argument above then runs with groups in place of ranks: the holders of chunk c are
  the groups holding it, the needers D' are the groups with a needer that do not hold
  every chunk of R between their GPUs (such a group can form R inside, for nothing),
  and x is the first group to know all of R, at message t. Of the chunks x lacks,
  take those with pairwise disjoint holder groups: the first message to carry each
  leaves a group that held it from the start, no message is the first for two of
  them (its sender would hold both), and all come by t. Every other group of D'
  completes R on receiving a message after t (a message completes at most one group,
  as it has one receiver). So at least pack_x + |D' - {x}| messages between groups,
  minimised over groups x. Each such message runs from a GPU outside the receiving
  group's node set to one inside it, so its route takes a link entering that set;
  the sets are disjoint, so a link enters at most one of them: T >= slot x sum /
  (sum over groups of the capacity of links entering the group from outside), and
  the same with links leaving. Traffic that only passes through a group's switches
  adds load and keeps the inequality. One GPU per group (no switches) is the volume
  bound above. The partitions tried: one GPU per group ("ranks"); one GPU per group
  with the switches and NICs that touch no other GPU (a DGX H100 GPU with its NIC:
  what enters is its NVLink and its rail, not its PCIe link to the NIC); the "fast domains"
  (for each link capacity c but the largest, the connected components of the links
  faster than c, parallel links added up; a component with no GPU is no group, and a
  GPU in none is a group of its own); and the two sides of the cut bound's witness.
  `volume_s` is the largest, and `volume_partition` names the partition that gave
  it. On dgx_h100(nodes=8) the nodes as groups give 2 x 7 x M / (8 x 400 Gbit/s) for
  AllReduce: each chunk's sum needs parts from 7 other nodes and goes out to 7.
- cut: for a set S of nodes (switches included), a requirement some GPU outside S
  needs, with a chunk whose holders all lie in S, sends at least one R-relevant
  message over a link leaving S: T >= slot x f(S) / B_out(S). Requirements entering
  S are the ones leaving the complement, so one direction covers both. See
  `_CutModel` for how the maximum over S is found (exactly by max-flow for AllGather,
  ReduceScatter, AllReduce, Broadcast, Reduce, Gather, Scatter; by a family of sets,
  spectral sweeps and local search for AllToAll and custom demands: always a valid
  bound, not guaranteed to be the maximum).
- latency: a missing chunk reaches its needer over a path from one of its holders, so
  T >= the least total link latency of such a path, maximised over (chunk, needer).

Only the volume bounds need the switch assumptions (for a switch in no group): their
in-capacity form fails if a switch reduces (fewer receptions than the gossip count),
their out-capacity form also if a switch copies (one send, several receptions). The other bounds would survive both.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

import collc.analysis.symmetry as symmetry
from collc.analysis.demand import (
    Requirement, disjoint_requirements, greedy_disjoint, pairwise_disjoint, requirements,
)
from collc.analysis.latency_cut import Crossing, latency_cut_bound
from collc.diagnostics import CollcError
from collc.ir.collective import Collective
from collc.ir.graphs import connected_components, minimum_cut
from collc.ir.topology import Topology

_US = 1e6
# Above this many nodes the cut search works on orbits, samples its sweeps and caps its
# local search; below it, it is exhaustive as before.
LARGE_MODEL = 512
SWEEP_PREFIXES = 64
LOCAL_SEARCH_SEEDS = 4
LOCAL_SEARCH_STEPS = 16


@dataclass(frozen=True)
class LowerBounds:
    """Lower bounds on completion time, in seconds; 0.0 where a bound does not apply."""

    ingress_s: float
    cut_s: float
    latency_s: float
    best_s: float  # the largest of the valid bounds above and below
    cut_witness: tuple[str, ...] = ()  # node names of the set S that gives cut_s
    egress_s: float = 0.0
    volume_s: float = 0.0
    dominant: str = ""  # which bound gives best_s: ingress|egress|volume|cut|latency|cut_latency
    volume_partition: str = ""  # the grouping of GPUs that gives volume_s (module docstring)
    # The cut bound over cut_witness with each link's latency window (collc.analysis.latency_cut).
    cut_latency_s: float = 0.0

    @property
    def bandwidth_s(self) -> float:
        """The largest of the bounds from links' bandwidth alone (no latency): what a
        fluid schedule, one that moves data at link rates without per-transfer costs,
        cannot beat either."""
        return max(self.ingress_s, self.egress_s, self.volume_s, self.cut_s)

    @property
    def with_latency_s(self) -> float:
        """best_s, or the cut bound with latency windows where that is larger."""
        return max(self.best_s, self.cut_latency_s)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("ingress", "egress", "volume", "cut", "cut_latency", "latency", "best"):
            sec = getattr(self, f"{name}_s")
            out[f"{name}_s"] = sec
            out[f"{name}_us"] = sec * _US
        out["dominant"] = self.dominant
        out["cut_witness"] = list(self.cut_witness)
        out["volume_partition"] = self.volume_partition
        return out


def lower_bounds(topology: Topology, collective: Collective, size_bytes: int) -> LowerBounds:
    """All the lower bounds of this module for `collective` on `topology`.

    Remembered for the last few inputs: synthesis (its tolerance) and the report ask for
    the same bounds, which on a thousand GPUs take a minute or more.

    `size_bytes` is each rank's output buffer size (nccl-tests' size); a slot is
    `collective.slot_bytes(size_bytes)` bytes. Raises CollcError when the problem
    cannot be met at all (ranks mismatch, a needed chunk unreachable).
    """
    _check_problem(topology, collective, size_bytes)
    if collective.demand is not None:
        return _demand_bounds(topology, collective.demand)
    return _lower_bounds(topology, collective, size_bytes)


@lru_cache(maxsize=4)
def _demand_bounds(topology: Topology, demand: tuple[tuple[int, int, float], ...]) -> LowerBounds:
    """The bounds of a demand matrix, in its own bytes (its collective's slots round
    them up): every entry (i, j, b) is b bytes that must go from GPU i to GPU j.

    - cut: for a node set S, the bytes of every entry from a GPU in S to one outside
      it leave S: T >= (those bytes) / B_out(S), searched as for AllToAll (the cut
      model with each pair weighted by its bytes and a slot of one byte);
    - ingress, egress: the same for one GPU (its column's or its row's bytes);
    - latency: the least latency from i to j, over the entries;
    - the cut with latency windows over the cut's set (collc.analysis.latency_cut)."""
    with threadpool_limits(limits=1, user_api="blas"):
        model = _CutModel(topology, (), 1.0)
        node = model.gpu_nodes
        model.groups = sorted((((node[i],),), (node[j],), b) for i, j, b in demand if i != j and b > 0)
        model._build_arrays()
        cut, witness = model.maximize()
        dist = _latency_distances(topology)
        latency = 0.0
        ranks = topology.num_ranks
        received, sent = np.zeros(ranks), np.zeros(ranks)
        for i, j, b in demand:
            if i != j and b > 0:
                if not np.isfinite(dist[i, j]):
                    raise CollcError(f"no schedule exists on '{topology.name}': GPU {topology.gpu(j).name} "
                                     f"(rank {j}) has no path of links from GPU {topology.gpu(i).name} "
                                     f"(rank {i}), which sends it {b:,.0f} bytes")
                latency = max(latency, float(dist[i, j]))
                received[j] += b
                sent[i] += b
        ingress = max(received[r] / _in_capacity(topology, r) for r in range(ranks))
        egress = max(sent[r] / _out_capacity(topology, r) for r in range(ranks))
        cut_latency = _cut_with_latency(model, witness)
    figures = {"ingress": ingress, "egress": egress, "cut": cut, "latency": latency}
    dominant = max(figures, key=lambda k: figures[k])
    return LowerBounds(ingress_s=ingress, cut_s=cut, latency_s=latency, best_s=max(figures.values()),
                       cut_witness=witness, egress_s=egress, dominant=dominant, cut_latency_s=cut_latency)


@lru_cache(maxsize=4)
def _lower_bounds(topology: Topology, collective: Collective, size_bytes: int) -> LowerBounds:
    # One BLAS thread: the matrices here are at most a few thousand wide, where threads
    # cost more than they give (an eigh of 1,024 x 1,024 took ten times the CPU with
    # OpenBLAS's threads on a busy 2-core machine), and one thread gives the same
    # floats on every machine, whatever its core count.
    with threadpool_limits(limits=1, user_api="blas"):
        return _compute_bounds(topology, collective, size_bytes)


def _compute_bounds(topology: Topology, collective: Collective, size_bytes: int) -> LowerBounds:
    reqs = requirements(collective)
    needed = tuple(r for r in reqs if r.needers)
    slot = collective.slot_bytes(size_bytes)
    dist = _latency_distances(topology)
    latency = _latency_bound(topology, needed, dist)  # also rejects unreachable demands
    ingress = _ingress_bound(topology, needed, slot)
    egress = _egress_bound(topology, needed, slot)
    model = _CutModel(topology, disjoint_requirements(reqs), slot)
    cut, witness = model.maximize()
    volume, partition = _volume_bound(topology, needed, slot, witness)
    cut_latency = _cut_with_latency(model, witness)
    # On a tie the first named wins: the cut (it has a witness) before the grouped
    # volume, which equals it whenever the best partition is the witness's two sides.
    # The cut with latency windows is reported beside best_s, not in it: it is a bound
    # for small messages (latency-bound), where the others leave out the path latency
    # every split route pays; at bandwidth-bound sizes it adds a few microseconds to
    # the cut bound, and best_s keeps the figures every compile has been measured by.
    figures = {"ingress": ingress, "egress": egress, "cut": cut, "volume": volume, "latency": latency}
    dominant = max(figures, key=lambda k: figures[k]) if any(v > 0 for v in figures.values()) else ""
    return LowerBounds(
        ingress_s=ingress, cut_s=cut, latency_s=latency, best_s=max(figures.values()),
        cut_witness=witness, egress_s=egress, volume_s=volume, dominant=dominant, cut_latency_s=cut_latency,
        volume_partition=partition if volume > 0 else "")


def _cut_with_latency(model: "_CutModel", witness: tuple[str, ...]) -> float:
    """The cut bound over the witness set with each leaving link's latency window."""
    if not witness:
        return 0.0
    inside = np.zeros(len(model.names), dtype=bool)
    inside[[model.index[n] for n in witness]] = True
    names = model.names
    crossings: list[Crossing] = []
    pair_rows, pair_cols = np.nonzero(model.pairs)
    for h, d in zip(pair_rows.tolist(), pair_cols.tolist()):
        if inside[h] and not inside[d]:
            crossings.append(Crossing((names[h],), (names[d],)))
    for opts, need, _ in model.groups:
        if len(opts) == 1 and len(opts[0]) == 1 and len(need) == 1:
            continue  # counted as a pair above
        within = [a for a in opts if inside[list(a)].all()]
        outside = [d for d in need if not inside[d]]
        if within and outside:
            crossings.append(Crossing(tuple(sorted({names[n] for a in within for n in a})),
                                      tuple(names[d] for d in outside)))
    return latency_cut_bound(model.topology, set(witness), model.slot * model.count(inside), crossings)


def cut_bound_of(topology: Topology, collective: Collective, size_bytes: int, nodes) -> float:
    """The cut bound slot x f(S) / B_out(S) for one given set S of node names."""
    _check_problem(topology, collective, size_bytes)
    slot = collective.slot_bytes(size_bytes)
    model = _CutModel(topology, disjoint_requirements(requirements(collective)), slot)
    x = np.zeros(len(model.names), dtype=bool)
    for name in nodes:
        if name not in model.index:
            raise CollcError(f"topology '{topology.name}' has no node '{name}'")
        x[model.index[name]] = True
    return model.ratio(x)


# --- checks and per-rank figures ------------------------------------------------------

def _check_problem(topology: Topology, collective: Collective, size_bytes: int) -> None:
    if topology.num_ranks != collective.ranks:
        raise CollcError(f"collective '{collective.name}' has {collective.ranks} ranks but topology "
                         f"'{topology.name}' has {topology.num_ranks} GPUs")
    if size_bytes < 0:
        raise CollcError(f"size must not be negative (got {size_bytes} bytes)")


def _in_capacity(topology: Topology, rank: int) -> float:
    return sum(link.capacity for link in topology.in_links[topology.gpu(rank).name])


def _out_capacity(topology: Topology, rank: int) -> float:
    return sum(link.capacity for link in topology.out_links[topology.gpu(rank).name])


def _per_rank_bound(counts: list[int], capacity: list[float], slot: float) -> float:
    best = 0.0
    for k, cap in zip(counts, capacity):
        if k and cap > 0:
            best = max(best, slot * k / cap)
    return best


def _ingress_bound(topology: Topology, needed: tuple[Requirement, ...], slot: float) -> float:
    """slot x (pairwise disjoint missing sets of rank v) / B_in(v), maximised over v."""
    ranks = topology.num_ranks
    if pairwise_disjoint(r.value for r in needed):
        # Disjoint values have disjoint missing sets: every needed value counts.
        counts = [0] * ranks
        for r in needed:
            for v in r.needers:
                counts[v] += 1
    else:
        counts = [len(greedy_disjoint(r.missing_at(v) for r in needed if v in r.needers)) for v in range(ranks)]
    return _per_rank_bound(counts, [_in_capacity(topology, v) for v in range(ranks)], slot)


def _egress_bound(topology: Topology, needed: tuple[Requirement, ...], slot: float) -> float:
    """slot x e_u / B_out(u): requirements another rank needs that hold a chunk only u has.

    One message from u serves R1 and R2 only if it lies in both and carries a chunk
    exclusive to u of each; picking R only when its exclusive chunks miss every value
    picked before rules that out for each pair.
    """
    ranks = topology.num_ranks
    disjoint = pairwise_disjoint(r.value for r in needed)
    if disjoint:
        # Only how many: each requirement counts once for every exclusive owner u with
        # a needer other than u (counted by C-level Counter updates, not a step per pair).
        tally: Counter[int] = Counter()
        for r in needed:
            if len(r.needers) > 1:
                tally.update(r.exclusive_owners())
            elif r.needers:
                tally.update(r.exclusive_owners() - r.needers)
        return _per_rank_bound([tally[u] for u in range(ranks)],
                               [_out_capacity(topology, u) for u in range(ranks)], slot)
    # Requirements by exclusive owner u, in order, where a rank other than u needs them.
    by_owner: list[list[Requirement]] = [[] for _ in range(ranks)]
    for r in needed:
        for u in sorted(r.exclusive_owners()):
            if len(r.needers) > 1 or (r.needers and u not in r.needers):
                by_owner[u].append(r)
    counts = []
    for u in range(ranks):
        cands = by_owner[u]
        if disjoint:
            counts.append(len(cands))
            continue
        used: set = set()
        k = 0
        for r in sorted(cands, key=lambda r: (len(r.value), r.chunks)):
            if used.isdisjoint(r.exclusive_chunks(u)):
                k += 1
                used |= r.value
        counts.append(k)
    return _per_rank_bound(counts, [_out_capacity(topology, u) for u in range(ranks)], slot)


def _messages_for(req: Requirement, group_of: tuple[int, ...]) -> int:
    """Least number of R-relevant messages between groups any schedule sends (module
    docstring, volume and grouped volume); `group_of[rank]` is the rank's group, and
    one group per rank gives the count between ranks."""
    if not req.needers:
        return 0
    holders = [frozenset(group_of[r] for r in hs) for hs in req.holders]
    # A group that holds every chunk of R between its GPUs forms R inside.
    covering = frozenset.intersection(*holders)
    needers = frozenset(group_of[d] for d in req.needers) - covering
    if not needers:
        return 0
    if all(len(hs) == 1 for hs in holders):
        owners = frozenset().union(*holders)
        return len(owners) + len(needers) - (2 if owners & needers else 1)
    # Groups that hold nothing of R and need nothing all give the same count: one of
    # them stands for the rest.
    named = frozenset().union(*holders) | needers
    spare = next((g for g in range(max(group_of) + 1) if g not in named), None)
    best = None
    for x in sorted(named) + ([spare] if spare is not None else []):
        senders = len(greedy_disjoint(hs for hs in holders if x not in hs))
        total = senders + len(needers - {x})
        best = total if best is None else min(best, total)
    return best or 0


@dataclass(frozen=True)
class _Partition:
    """GPUs in groups for the grouped volume bound: per rank its group, per group its
    node set (disjoint), and what to call the partition in the report."""

    name: str
    group_of: tuple[int, ...]
    nodes: tuple[frozenset[str], ...]


def _rank_partition(topology: Topology) -> _Partition:
    return _Partition("ranks", tuple(range(topology.num_ranks)),
                      tuple(frozenset((g.name,)) for g in topology.gpus))


def _partition_of(topology: Topology, name: str, node_sets) -> _Partition | None:
    """The partition whose groups are the given disjoint node sets that hold GPUs; a GPU
    in none of them is a group of its own. None when it is one group (nothing crosses)."""
    rank_of = {g.name: g.rank for g in topology.gpus}
    group_of = [-1] * topology.num_ranks
    groups: list[frozenset[str]] = []
    for nodes in sorted((frozenset(s) for s in node_sets), key=lambda s: sorted(s)):
        ranks = [rank_of[n] for n in nodes if n in rank_of]
        if not ranks:
            continue  # no GPU: nothing is held there
        for r in ranks:
            group_of[r] = len(groups)
        groups.append(nodes)
    for r in range(topology.num_ranks):
        if group_of[r] < 0:
            group_of[r] = len(groups)
            groups.append(frozenset((topology.gpu(r).name,)))
    if len(groups) < 2:
        return None
    return _Partition(f"{name} ({len(groups)} groups)", tuple(group_of), tuple(groups))


def _private_nodes(topology: Topology) -> list[_Partition]:
    """Each GPU with the switches and NICs that only it touches (a NIC on its own PCIe
    link): what enters such a group is capped by the links into those nodes as well
    (a DGX H100 GPU takes 450 GB/s of NVLink and 50 GB/s from its rail, not the 64 GB/s
    of its PCIe link to the NIC). Empty when no switch or NIC has one GPU alone."""
    gpu_names = {g.name for g in topology.gpus}
    touching: dict[str, set[str]] = {}
    for link in topology.links:
        for a, b in ((link.src, link.dst), (link.dst, link.src)):
            if a not in gpu_names and b in gpu_names:
                touching.setdefault(a, set()).add(b)
    own: dict[str, set[str]] = {g: {g} for g in gpu_names}
    for node, gpus in touching.items():
        if len(gpus) == 1:
            own[next(iter(gpus))].add(node)
    if all(len(nodes) == 1 for nodes in own.values()):
        return []
    part = _partition_of(topology, "GPUs with the NICs only they reach", own.values())
    return [part] if part is not None else []


def _fast_domains(topology: Topology) -> list[_Partition]:
    """For each link capacity c but the largest: the connected components of the links
    faster than c (capacities of parallel links between two nodes added up)."""
    pair: dict[tuple[str, str], float] = {}
    for link in topology.links:
        key = (link.src, link.dst)
        pair[key] = pair.get(key, 0.0) + link.capacity
    out = []
    for level in sorted(set(pair.values()))[:-1]:
        components = connected_components((n.name for n in topology.nodes),
                                          (k for k, c in pair.items() if c > level))
        part = _partition_of(topology, f"links above {level / 1e9:g} GB/s", components)
        if part is not None:
            out.append(part)
    return out


def _witness_partition(topology: Topology, witness: tuple[str, ...]) -> list[_Partition]:
    if not witness:
        return []
    inside = frozenset(witness)
    rest = frozenset(n.name for n in topology.nodes) - inside
    part = _partition_of(topology, "the cut witness and the rest", (inside, rest))
    return [part] if part is not None else []


def _grouped_volume(topology: Topology, family: tuple[Requirement, ...], slot: float, part: _Partition,
                    messages: int | None = None) -> float:
    """slot x (messages between groups) / (capacity entering, or leaving, the groups).
    `messages`: the count, where already known for the same grouping of GPUs."""
    if messages is None:
        messages = _messages_between(family, part.group_of)
    if not messages:
        return 0.0
    where = {n: k for k, nodes in enumerate(part.nodes) for n in nodes}
    entering = leaving = 0.0
    for link in topology.links:
        src, dst = where.get(link.src), where.get(link.dst)
        if dst is not None and src != dst:
            entering += link.capacity
        if src is not None and src != dst:
            leaving += link.capacity
    return max((slot * messages / cap for cap in (entering, leaving) if cap > 0), default=0.0)


def _single_pairs(family: tuple[Requirement, ...]) -> tuple[np.ndarray, np.ndarray, tuple[Requirement, ...]]:
    """The requirements of one chunk held by one rank and needed by one rank (all of an
    AllToAll's) as (holder ranks, needer ranks), and the others."""
    holder: list[int] = []
    needer: list[int] = []
    rest: list[Requirement] = []
    for req in family:
        holders, needers = req.holders, req.needers
        if len(holders) == 1 and len(holders[0]) == 1 and len(needers) == 1:
            holder.extend(holders[0])
            needer.extend(needers)
        else:
            rest.append(req)
    return np.array(holder, dtype=np.intp), np.array(needer, dtype=np.intp), tuple(rest)


def _messages_between(family: tuple[Requirement, ...], group_of: tuple[int, ...],
                      pairs: tuple[np.ndarray, np.ndarray, tuple[Requirement, ...]] | None = None) -> int:
    """The least messages between groups over the family (`_messages_for` summed).
    `pairs`: the family's `_single_pairs`, where the caller has them. A one-chunk
    requirement with one holder h and one needer d costs one message when h and d are
    in different groups, none otherwise: counted on arrays."""
    holder, needer, rest = pairs if pairs is not None else _single_pairs(family)
    groups = np.asarray(group_of, dtype=np.intp)
    messages = int(np.count_nonzero(groups[holder] != groups[needer])) if len(holder) else 0
    counts: dict[tuple, int] = {}
    for req in rest:
        # Requirements alike up to their chunks' names count alike (AllReduce: all of them).
        key = (req.holders, req.needers)
        if key not in counts:
            counts[key] = _messages_for(req, group_of)
        messages += counts[key]
    return messages


def _volume_bound(topology: Topology, needed: tuple[Requirement, ...], slot: float,
                  witness: tuple[str, ...] = ()) -> tuple[float, str]:
    """The largest grouped volume bound over the partitions of the module docstring,
    and the partition's name."""
    family = disjoint_requirements(needed)
    best, name = 0.0, ""
    parts = ([_rank_partition(topology)] + _private_nodes(topology) + _fast_domains(topology)
             + _witness_partition(topology, witness))
    # Partitions that group the GPUs alike (one per group, with or without their NICs)
    # count the same messages: at 1,024 GPUs an AllToAll has a million requirements.
    counted: dict[tuple[int, ...], int] = {}
    pairs = _single_pairs(family)
    for part in parts:
        if part.group_of not in counted:
            counted[part.group_of] = _messages_between(family, part.group_of, pairs)
        value = _grouped_volume(topology, family, slot, part, counted[part.group_of])
        if value > best * (1 + 1e-12):
            best, name = value, part.name
    return best, name


# --- latency --------------------------------------------------------------------------

def _latency_distances(topology: Topology) -> np.ndarray:
    """Least total latency from each GPU to each GPU (by rank; inf where no path leads);
    paths may cross GPUs, since a relay only adds time.

    networkx's Dijkstra (`single_source_dijkstra_path_length`, weight "latency") run
    over integer node ids: the same relaxations in the same order (successors in link
    order, ties broken by push order), so every distance is the same float, to the bit,
    at a fraction of the cost (1,024 searches on 1,024 GPUs)."""
    index = {n.name: i for i, n in enumerate(topology.nodes)}
    succ: list[dict[int, float]] = [{} for _ in topology.nodes]
    for link in topology.links:
        succ[index[link.src]][index[link.dst]] = link.latency  # one Link per ordered pair
    adjacency = [list(d.items()) for d in succ]
    gpu_nodes = [index[g.name] for g in topology.gpus]
    rank_of = [-1] * len(topology.nodes)
    for rank, v in enumerate(gpu_nodes):
        rank_of[v] = rank
    out = np.full((len(gpu_nodes), len(gpu_nodes)), np.inf)
    for rank, source in enumerate(gpu_nodes):
        row = out[rank]
        for v, d in _dijkstra(adjacency, source).items():
            if rank_of[v] >= 0:
                row[rank_of[v]] = d
    return out


def _dijkstra(adjacency: list[list[tuple[int, float]]], source: int) -> dict[int, float]:
    """networkx's `_dijkstra_multisource` for one source, no cutoff, no paths."""
    dist: dict[int, float] = {}
    seen: dict[int, float] = {source: 0}
    tick = 0
    fringe: list[tuple[float, int, int]] = [(0, 0, source)]
    push, pop = heapq.heappush, heapq.heappop
    while fringe:
        dist_v, _, v = pop(fringe)
        if v in dist:
            continue
        dist[v] = dist_v
        for u, cost in adjacency[v]:
            vu_dist = dist_v + cost
            if u in dist:
                continue
            if u not in seen or vu_dist < seen[u]:
                seen[u] = vu_dist
                tick += 1
                push(fringe, (vu_dist, tick, u))
    return dist


def _minimal_sets(sets) -> list[frozenset]:
    """Distinct sets with supersets dropped: a chunk with more holders is never harder
    to deliver (or to keep inside a cut) than one with a subset of them.

    Remembered per family (the requirements of an AllReduce all have the same holder
    sets), and near-linear: a kept set k can lie inside s only if k's smallest element
    is in s, so s is tested only against the kept sets filed under its own elements
    (every kept set is a singleton in the standard collectives: one lookup per element)."""
    return _minimal_of_family(tuple(sets))


@lru_cache(maxsize=64)
def _minimal_of_family(family: tuple[frozenset, ...]) -> list[frozenset]:
    uniq = sorted(set(family), key=lambda s: (len(s), sorted(s)))
    if uniq and not uniq[0]:
        return [uniq[0]]  # the empty set lies inside every other
    keep: list[frozenset] = []
    by_least: dict = {}  # smallest element -> kept sets with it
    for s in uniq:
        if not any(k <= s for e in s for k in by_least.get(e, ())):
            keep.append(s)
            by_least.setdefault(min(s), []).append(s)
    return keep


def _latency_bound(topology: Topology, needed: tuple[Requirement, ...], dist: np.ndarray) -> float:
    """max over (requirement, needer d, minimal holder set A without d) of the least
    latency from A to d; a maximum, so any order of the comparisons gives the same float.

    Requirements whose holder sets are each one rank (every one of an AllToAll, an
    AllGather, a ReduceScatter) have those ranks as their minimal sets: their terms are
    dist[h, d] for every holder h and needer d != h, gathered into arrays and maximised
    at once. Where one of them is infinite, the requirements are gone through in order,
    so that the error names the first unreachable one."""
    # Requirements with the same holder ranks and needers give the same terms: each
    # such family is gathered once (an AllReduce on 1,024 ranks has a million
    # requirements of one family; term by term they passed 23 GiB).
    families: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    rest: list[Requirement] = []
    for req in needed:
        holders = req.holders
        if all(len(hs) == 1 for hs in holders):
            families.add((tuple(sorted({h for hs in holders for h in hs})), tuple(sorted(req.needers))))
        else:
            rest.append(req)
    best = 0.0
    for ranks, needers in families:
        h = np.array(ranks, dtype=np.intp)
        d = np.array(needers, dtype=np.intp)
        terms = dist[np.ix_(h, d)]
        others = h[:, None] != d[None, :]
        if not others.any():
            continue
        if np.isinf(terms[others]).any():
            return _latency_bound_in_order(topology, needed, dist)
        best = max(best, float(terms[others].max()))
    return max(best, _latency_bound_in_order(topology, tuple(rest), dist))


def _latency_bound_in_order(topology: Topology, needed: tuple[Requirement, ...], dist: np.ndarray) -> float:
    """`_latency_bound` requirement by requirement, raising for the first unreachable."""
    best = 0.0
    seen: set = set()
    for req in needed:
        options = tuple(_minimal_sets(req.holders))
        key = (options, req.needers)
        if key in seen:
            continue
        seen.add(key)
        # One-holder options (every option of the standard collectives) as one index array.
        singles = np.array([next(iter(hs)) for hs in options if len(hs) == 1], dtype=np.intp)
        larger = [np.array(sorted(hs), dtype=np.intp) for hs in options if len(hs) > 1]
        for d in sorted(req.needers):
            column = dist[:, d]
            reach = column[singles[singles != d]]
            nearest = [float(column[hs].min()) for hs in larger if d not in hs]
            if np.isinf(reach).any() or any(np.isinf(x) for x in nearest):
                _raise_unreachable(topology, req, options, d, dist)
            if reach.size:
                best = max(best, float(reach.max()))
            if nearest:
                best = max(best, max(nearest))
    return best


def _raise_unreachable(topology: Topology, req: Requirement, options: tuple, d: int, dist: np.ndarray) -> None:
    """The error for the first option (in order) that no path joins to needer d."""
    dname = topology.gpu(d).name
    for hs in options:
        if d not in hs and all(np.isinf(dist[h, d]) for h in hs):
            chunk = next(c for c, h in zip(req.chunks, req.holders) if h == hs)
            raise CollcError(
                f"rank {d} needs {chunk}, but no path of links leads to {dname} from "
                f"{', '.join(topology.gpu(h).name for h in sorted(hs))}")
    raise AssertionError("unreachable option not found")


# --- the cut bound --------------------------------------------------------------------

# (holder-set options as node indices, needers as node indices, weight)
_Group = tuple[tuple[tuple[int, ...], ...], tuple[int, ...], float]


def _is_pair(opts: tuple[tuple[int, ...], ...], need: tuple[int, ...]) -> bool:
    """A group of one holder set of one node and one needer (an AllToAll's)."""
    return len(opts) == 1 and len(opts[0]) == 1 and len(need) == 1


class _CutModel:
    """f(S) and B_out(S) over node sets S, and the search for max slot x f(S) / B_out(S).

    f(S) counts the requirements (pairwise disjoint values) that some GPU outside S
    needs and that hold a chunk whose holders all lie in S. Requirements with the same
    holder sets and needers are grouped with a weight.

    The maximum is searched three ways, every candidate S scored with the true f:
    1. Parametric max-flow (Dinkelbach): for a time T, "T x B_out(S) >= slot x g(S) for
       all S" is one min-cut check when g is a sum of terms [A <= S] over sets S that
       exclude a fixed sink GPU v: a super-source feeds each holder set A (through a
       gadget node with infinite edges to A's members when |A| > 1) with slot x w / T,
       topology edges keep their capacity, and the check holds iff the max flow to v
       equals the supply. A violated check returns the min-cut side S, whose ratio
       becomes the next T. Sink-fixed at each needer v, g counts the requirements v
       needs (one holder set per requirement; for a reduction, the set holding the most
       common contributor); source-fixed at each GPU u (the same search on reversed
       links), g counts the requirements with a chunk only u holds, each for one
       needer. This is exact when every GPU outside S needs what crosses (AllGather,
       Broadcast, Gather, AllReduce) or every GPU inside S owns a part of it
       (ReduceScatter, Reduce, Scatter), as the tests check against enumeration.
    2. A family of sets: single nodes and their complements, the components left
       after dropping links up to each capacity level (chassis, islands), and the best
       prefixes of spectral orderings (see `_spectral_sweeps`).
    3. Steepest-ascent local search (add or drop one node) from all of those, which is
       what finds the bisection-like sets AllToAll needs; exact maximisation there is
       a sparsest-cut problem (NP-hard), so for AllToAll and custom demands the bound
       is the best set found, valid but possibly below the true maximum.
    """

    def __init__(self, topology: Topology, family: tuple[Requirement, ...], slot: float):
        self.topology = topology
        self.slot = slot
        self.names = [n.name for n in topology.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        size = len(self.names)
        self.gpu_nodes = [self.index[g.name] for g in topology.gpus]
        self.cap = np.zeros((size, size))
        for link in topology.links:
            self.cap[self.index[link.src], self.index[link.dst]] += link.capacity
        positive = self.cap[self.cap > 0]
        self.min_capacity = float(positive.min()) if positive.size else 0.0
        self.groups = self._group(family)
        self._orbits: np.ndarray | None = None
        self._single_coo: tuple[np.ndarray, np.ndarray] | None = None
        self._need_rows: tuple[np.ndarray, np.ndarray] | None = None
        self._build_arrays()

    # -- requirements as node-level groups --
    def _group(self, family: tuple[Requirement, ...]) -> list[_Group]:
        node = self.gpu_nodes
        weights: dict[tuple, float] = {}
        # id(minimal sets) -> (them, as node tuples): requirements with one family share
        # the list; it is kept here so that its id cannot be reused.
        as_nodes: dict[int, tuple[list, tuple]] = {}
        for req in family:
            minimal = _minimal_sets(req.holders)
            hit = as_nodes.get(id(minimal))
            if hit is not None and hit[0] is minimal:
                options = hit[1]
            else:
                options = tuple(tuple(sorted(node[r] for r in hs)) for hs in minimal)
                as_nodes[id(minimal)] = (minimal, options)
            needers = tuple(sorted(node[r] for r in req.needers))
            key = (options, needers)
            weights[key] = weights.get(key, 0.0) + 1.0
        return [(opts, need, w) for (opts, need), w in sorted(weights.items())]

    def _build_arrays(self) -> None:
        size = len(self.names)
        # One-holder, one-needer groups (AllToAll-like) form a matrix: f = x' W (1 - x).
        self.pairs = np.zeros((size, size))
        rest = []
        for opts, need, w in self.groups:
            if _is_pair(opts, need):
                self.pairs[opts[0][0], need[0]] += w
            else:
                rest.append((opts, need, w))
        self.has_pairs = bool(self.pairs.any())
        # For the other groups: single-node holder options as a group x node incidence
        # matrix (the common case, cheap to score), larger options as rows of `opt`
        # with `opt_group` naming their group.
        self.single = np.zeros((len(rest), size))
        self.need = np.zeros((len(rest), size))
        self.weight = np.array([w for _, _, w in rest])
        opt_rows, opt_group = [], []
        for g, (opts, need, _) in enumerate(rest):
            self.need[g, list(need)] = 1.0
            for a in opts:
                if len(a) == 1:
                    self.single[g, a[0]] = 1.0
                else:
                    row = np.zeros(size)
                    row[list(a)] = 1.0
                    opt_rows.append(row)
                    opt_group.append(g)
        self.opt = np.array(opt_rows).reshape(-1, size)
        self.opt_group = np.array(opt_group, dtype=np.intp)

    # -- scoring --
    def count(self, x: np.ndarray) -> float:
        inside = x.astype(float)
        outside = 1.0 - inside
        f = float(inside @ self.pairs @ outside) if self.has_pairs else 0.0
        if len(self.weight):
            has = (self.single @ inside) > 0.5
            if len(self.opt):
                full = (self.opt @ outside) < 0.5
                has[self.opt_group[full]] = True
            cross = has & ((self.need @ outside) > 0.5)
            f += float(self.weight @ cross)
        return f

    def out_capacity(self, x: np.ndarray) -> float:
        inside = x.astype(float)
        return float(inside @ self.cap @ (1.0 - inside))

    def ratio(self, x: np.ndarray) -> float:
        b = self.out_capacity(x)
        return self.slot * self.count(x) / b if b > 0 else 0.0

    def flip_ratios(self, x: np.ndarray) -> np.ndarray:
        """The ratio of every set that differs from x in one node."""
        inside = x.astype(float)
        outside = 1.0 - inside
        leaves = np.where(x, 1.0, -1.0)  # +1: flipping k moves it out of S

        def flipped_sum(m: np.ndarray) -> np.ndarray:  # x' M (1 - x') for every one-node flip
            row_out = m @ outside
            col_in = inside @ m
            return float(inside @ row_out) - leaves * (row_out - col_in)

        b = flipped_sum(self.cap)
        f = flipped_sum(self.pairs) if self.has_pairs else np.zeros(len(x))
        if len(self.weight):
            groups = None if len(self.opt) else self._flipped_groups_sparse(inside, outside, leaves)
            f = f + (groups if groups is not None else self._flipped_groups(inside, outside, leaves))
        # A true B_out is 0 or at least the smallest link; anything below half of that
        # is rounding left by the subtraction above.
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(b > self.min_capacity / 2, self.slot * f / b, 0.0)

    def _flipped_groups(self, inside: np.ndarray, outside: np.ndarray, leaves: np.ndarray) -> np.ndarray:
        """The groups' part of f for every one-node flip, as group x node matrices."""
        has = ((self.single @ inside)[:, None] - self.single * leaves[None, :]) > 0.5
        if len(self.opt):
            full = ((self.opt @ outside)[:, None] + self.opt * leaves[None, :]) < 0.5
            np.logical_or.at(has, self.opt_group, full)
        need_out = (self.need @ outside)[:, None] + self.need * leaves[None, :]
        return self.weight @ (has & (need_out > 0.5))

    def _flipped_groups_sparse(self, inside: np.ndarray, outside: np.ndarray,
                               leaves: np.ndarray) -> np.ndarray | None:
        """`_flipped_groups` without multi-node holder options, from the few (group,
        node) pairs where a flip changes anything: a group's holder count flips its
        "has" only from 0 or 1, its outside-needer count its "needed" only from 0 or 1.
        Every term is a whole number of requirements (exact in floating point), so the
        sums equal the matrix form's to the bit. None where most groups are at such a
        threshold (the matrix form is then as cheap)."""
        holders_in = self.single @ inside
        needers_out = self.need @ outside
        cross = (holders_in > 0.5) & (needers_out > 0.5)
        base = float(self.weight @ cross)
        rows, cols = self._sparse_single
        at_edge = holders_in[rows] < 1.5
        pair_g, pair_k = [rows[at_edge]], [cols[at_edge]]
        critical = np.flatnonzero(needers_out < 1.5)
        if len(critical) * 4 > len(needers_out):
            return None
        starts, needers = self._sparse_need
        for g in critical.tolist():
            ks = needers[starts[g]:starts[g + 1]]
            if holders_in[g] < 1.5:  # pairs (g, holder) are listed already
                ks = ks[self.single[g, ks] == 0]
            pair_g.append(np.full(len(ks), g, dtype=np.intp))
            pair_k.append(ks)
        g_all, k_all = np.concatenate(pair_g), np.concatenate(pair_k)
        size = len(inside)
        out = np.full(size, base)
        if not len(g_all):
            return out
        has = (holders_in[g_all] - self.single[g_all, k_all] * leaves[k_all]) > 0.5
        needed = (needers_out[g_all] + self.need[g_all, k_all] * leaves[k_all]) > 0.5
        change = self.weight[g_all] * ((has & needed).astype(float) - cross[g_all])
        return out + np.bincount(k_all, weights=change, minlength=size)

    @property
    def _sparse_single(self) -> tuple[np.ndarray, np.ndarray]:
        if self._single_coo is None:
            self._single_coo = np.nonzero(self.single)
        return self._single_coo

    @property
    def _sparse_need(self) -> tuple[np.ndarray, np.ndarray]:
        """The need matrix as rows: (row starts, node indices)."""
        if self._need_rows is None:
            rows, cols = np.nonzero(self.need)
            starts = np.searchsorted(rows, np.arange(len(self.need) + 1))
            self._need_rows = (starts, cols)
        return self._need_rows

    # -- the search --
    def maximize(self) -> tuple[float, tuple[str, ...]]:
        if not self.groups or self.slot <= 0:
            return 0.0, ()
        best = [0.0, None]

        def offer(x: np.ndarray | None) -> None:
            if x is None or not x.any() or x.all():
                return
            r = self.ratio(x)
            if r > best[0]:
                best[0], best[1] = r, x.copy()

        seeds = self._family() + self._spectral_sweeps()
        for x in seeds:
            offer(x)
        for x in self._flow_witnesses(best[0]):
            offer(x)
            seeds.append(x)
            seeds.append(~x)
        for x in self._local_search(seeds):
            offer(x)
        if best[1] is None:
            return 0.0, ()
        return best[0], tuple(self.names[i] for i in np.flatnonzero(best[1]))

    def _family(self) -> list[np.ndarray]:
        size = len(self.names)
        seeds = []
        # One node alone (and all but one): the images of a set under an automorphism
        # have its ratio, so one node per orbit is enough.
        orbit = self._node_orbits() if size > LARGE_MODEL else np.arange(size)
        for i in sorted(set(orbit.tolist())):
            x = np.zeros(size, dtype=bool)
            x[i] = True
            seeds += [x, ~x]
        levels = sorted({float(c) for c in self.cap[self.cap > 0]})
        for level in levels[:-1]:
            a, b = np.nonzero(self.cap > level)
            for comp in connected_components(range(size), zip(a.tolist(), b.tolist())):
                if 1 < len(comp) < size:
                    x = np.zeros(size, dtype=bool)
                    x[list(comp)] = True
                    seeds += [x, ~x]
        return seeds

    def _spectral_sweeps(self, vectors: int = 4) -> list[np.ndarray]:
        """Prefixes of the nodes ordered by each of the Laplacian's first nontrivial
        eigenvectors (capacities made symmetric): the classic sparsest-cut heuristic,
        which reaches the balanced bands (half a torus, half a ring) that one-node moves
        cannot climb to."""
        size = len(self.names)
        if size < 3:
            return []
        weight = self.cap + self.cap.T
        laplacian = np.diag(weight.sum(axis=1)) - weight
        _, vecs = np.linalg.eigh(laplacian)
        scored = []
        # On large topologies every stride-th prefix (a few hundred per vector).
        stride = max(1, size // SWEEP_PREFIXES) if size > LARGE_MODEL else 1
        for k in range(1, min(vectors + 1, size)):
            order = np.argsort(vecs[:, k], kind="stable")
            x = np.zeros(size, dtype=bool)
            for j, i in enumerate(order[:-1]):
                x[i] = True
                if j % stride:
                    continue
                scored.append((self.ratio(x), x.copy()))
                scored.append((self.ratio(~x), ~x))
        scored.sort(key=lambda rx: -rx[0])
        return [x for _, x in scored[:2 * vectors]]

    def _local_search(self, seeds: list[np.ndarray]) -> list[np.ndarray]:
        visited: set[bytes] = set()
        found = []
        # Every flip is a pass over the model; on large topologies each climb is capped
        # (any set is a valid bound: the cap only limits how far the search looks).
        limit = len(self.names) + 1
        if len(self.names) > LARGE_MODEL:
            limit = LOCAL_SEARCH_STEPS
            seeds = sorted(seeds, key=lambda x: -self.ratio(x))[:LOCAL_SEARCH_SEEDS]
        for x in seeds:
            x = x.copy()
            if x.tobytes() in visited:
                continue
            r = self.ratio(x)
            steps = 0
            while steps < limit:
                steps += 1
                visited.add(x.tobytes())
                flips = self.flip_ratios(x)
                k = int(np.argmax(flips))
                if not flips[k] > r * (1 + 1e-9):
                    break
                x[k] = not x[k]
                r = float(flips[k])
                if x.tobytes() in visited:
                    break
            found.append(x)
        return found

    # -- parametric max-flow --
    def _flow_witnesses(self, start: float) -> list[np.ndarray]:
        if start <= 0:
            return []
        forward = [(int(a), int(b), float(self.cap[a, b])) for a, b in zip(*np.nonzero(self.cap))]
        backward = [(b, a, c) for a, b, c in forward]
        t = start
        witnesses = []
        starts = self._orbit_representatives()
        for v in starts:
            t, found = self._parametric(forward, self._sink_terms(v), v, t, complement=False)
            witnesses += found
        for u in starts:
            t, found = self._parametric(backward, self._source_terms(u), u, t, complement=True)
            witnesses += found
        return witnesses

    def _orbit_representatives(self) -> list[int]:
        """GPU nodes to start the flow searches from: one per orbit of the topology's
        automorphisms (identical nodes and rails, collc.analysis.symmetry) that also
        map the requirements onto themselves. A search from another GPU of the orbit
        finds the images of the same sets, with the same ratios; leaving it out loses
        nothing, and at 1,024 GPUs it saves two thousand max-flows."""
        orbit = self._node_orbits()
        return sorted({int(orbit[v]) for v in self.gpu_nodes})

    def _node_orbits(self) -> np.ndarray:
        """For every node, the smallest node its orbit (as above) holds."""
        if self._orbits is not None:
            return self._orbits
        size = len(self.names)
        parent = np.arange(size)

        def find(v: int) -> int:
            while parent[v] != v:
                v = int(parent[v])
            return v

        gens = symmetry.generators(self.topology)
        # The one-holder, one-needer groups (an AllToAll's million) are the matrix
        # `pairs`, one entry per group (its weight): g maps them onto themselves iff
        # the matrix with rows and columns permuted by g is the same. The other groups
        # are compared as sets.
        groups = {(frozenset(opts), frozenset(need), w) for opts, need, w in self.groups
                  if not _is_pair(opts, need)} if gens else set()
        for g in gens:
            perm = np.asarray(g, dtype=np.intp)
            if self.has_pairs and not np.array_equal(self.pairs[np.ix_(perm, perm)], self.pairs):
                continue  # the demand breaks this symmetry
            image = {(frozenset(tuple(sorted(int(g[n]) for n in a)) for a in opts),
                      frozenset(int(g[n]) for n in need), w) for opts, need, w in groups}
            if image != groups:
                continue  # the demand breaks this symmetry (a root, say)
            for v in range(size):
                a, b = find(v), find(int(g[v]))
                if a != b:
                    parent[max(a, b)] = min(a, b)
        self._orbits = np.array([find(v) for v in range(size)])
        return self._orbits

    def _seed(self, choices: list[tuple[tuple[int, ...], float]], exclude: int) -> int | None:
        """The node most often among the multi-way choices (by weight), lowest index on ties."""
        score: dict[int, float] = {}
        for nodes, w in choices:
            for n in nodes:
                if n != exclude:
                    score[n] = score.get(n, 0.0) + w
        return min(score, key=lambda n: (-score[n], n)) if score else None

    def _sink_terms(self, v: int) -> list[tuple[tuple[int, ...], float]]:
        """Terms [A <= S] for requirements GPU v needs, with S excluding v."""
        mine = []
        for opts, need, w in self.groups:
            if v in need:
                usable = [a for a in opts if v not in a]
                if usable:
                    mine.append((usable, w))
        seed = self._seed([(tuple(n for a in usable for n in a), w) for usable, w in mine if len(usable) > 1], v)
        terms = []
        for usable, w in mine:
            with_seed = [a for a in usable if seed in a]
            terms.append((min(with_seed or usable, key=lambda a: (len(a), a)), w))
        return terms

    def _source_terms(self, u: int) -> list[tuple[tuple[int, ...], float]]:
        """Terms [d outside S] for requirements with a chunk only GPU u holds, S containing u;
        returned as terms [d <= S'] of the complement S' on reversed links."""
        mine = []
        for opts, need, w in self.groups:
            if (u,) in opts:
                others = tuple(d for d in need if d != u)
                if others:
                    mine.append((others, w))
        seed = self._seed([(others, w) for others, w in mine if len(others) > 1], u)
        return [(((seed,) if seed in others else (others[0],)), w) for others, w in mine]

    def _parametric(self, edges, terms, sink: int, t: float, complement: bool) -> tuple[float, list[np.ndarray]]:
        found: list[np.ndarray] = []
        if not terms:
            return t, found
        size = len(self.names)
        for _ in range(64):
            supply = sum(w for _, w in terms) * self.slot / t
            # The network holds the nodes that some edge touches (and the sink): a node
            # on no edge is on neither side of the cut.
            capacity: dict[Any, dict[Any, float]] = {sink: {}}
            for a, b, c in edges:
                capacity.setdefault(a, {})[b] = c
                capacity.setdefault(b, {})
            source = "source"
            capacity[source] = {}
            for k, (nodes, w) in enumerate(terms):
                amount = w * self.slot / t
                if len(nodes) == 1:
                    n = nodes[0]
                    capacity[source][n] = capacity[source].get(n, 0.0) + amount
                    capacity.setdefault(n, {})
                else:
                    gadget = ("all-of", k)
                    capacity[source][gadget] = amount
                    capacity[gadget] = dict.fromkeys(nodes, math.inf)  # no limit
                    for n in nodes:
                        capacity.setdefault(n, {})
            value, reach = minimum_cut(capacity, source, sink)
            if value >= supply * (1 - 1e-9):
                break
            x = np.zeros(size, dtype=bool)
            x[[n for n in reach if isinstance(n, int)]] = True
            if complement:
                x = ~x
            r = self.ratio(x)
            if not r > t * (1 + 1e-12):
                break
            t = r
            found.append(x)
        return t, found


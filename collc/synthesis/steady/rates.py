"""Which rate LP a problem gets: trees or flows, solved whole or once per orbit of
identical sources and replicated, with or without a limit on peers per GPU."""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from typing import Callable

import numpy as np

from collc.synthesis.network import Network
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, SolverOptions
from collc.synthesis.steady.colgen import EXCESS_PRICE, SPREADS
from collc.synthesis.steady.flows import flow_rates
from collc.synthesis.steady.replicated import class_orbits, replicated_tree_rates
from collc.synthesis.steady.replicated_flow import pair_orbits, replicated_path_rates
from collc.synthesis.steady.solution import RateSolution, check_applicable, class_bytes
from collc.synthesis.steady.trees import tree_rates
from collc.synthesis.symmetry import find_symmetry

# From this many GPUs on, the tree LP is solved once per orbit of identical sources and
# replicated (collc.synthesis.steady.replicated) wherever the topology has such
# symmetries. A symmetric LP has a symmetric optimum, so T is the same, and the
# replicated packing is found in fewer pricing rounds. AllGather 1 GiB, first schedule,
# replicated against whole: dgx2(chassis=2) 1.0001 against 1.0011, dgx_h100(nodes=4)
# 1.0039 after 2 LP solves against 1.0114 after 92. On 16 GPUs it is not always better:
# dgx_h100(nodes=2) 1.0009 against 1.0063 at 128 chunks, but 1.0325 against 1.0119 when
# MSCCL XML's size cap holds it to 64 chunks; so 16-GPU topologies keep the whole LP.
REPLICATE_FROM_RANKS = 32


def solve_rates(problem: Problem, options: SolverOptions, deadline: Deadline, progress: Progress,
                spread: float = SPREADS[0]) -> RateSolution:
    check_applicable(problem)
    if problem.ranks >= REPLICATE_FROM_RANKS:
        replicated = _replicated_rates(problem, options, deadline, progress, spread)
        if replicated is not None:
            return replicated
    if problem.unicast:
        return flow_rates(problem, options, deadline, progress)
    return tree_rates(problem, options, deadline, progress, spread)


def _replicated_rates(problem: Problem, options: SolverOptions, deadline: Deadline, progress: Progress,
                      spread: float) -> RateSolution | None:
    """The rate LP solved once per orbit of identical classes and replicated: trees per
    source (collc.synthesis.steady.replicated), or paths per source-destination pair
    for unicast demands (collc.synthesis.steady.replicated_flow); None where the
    topology or the demand has no such symmetry."""
    sym = find_symmetry(problem.network)
    if sym is None:
        return None
    classes = class_bytes(problem)
    if problem.unicast:
        orbits = pair_orbits(classes, sym, problem.ranks)
        what, rates = "source-destination pairs", replicated_path_rates
    else:
        orbits = class_orbits(problem, classes, sym)
        what, rates = "sources", replicated_tree_rates
    if orbits is None or len(orbits) == len(classes):
        return None
    progress.stage(f"steady: rate LP for {len(orbits)} of {len(classes)} {what} (identical nodes)")
    return _within_peer_limit(problem, options, lambda o: rates(
        problem, sym, orbits, classes, o, deadline, progress, spread, EXCESS_PRICE))


def _within_peer_limit(problem: Problem, options: SolverOptions,
                       solve: Callable[[SolverOptions], RateSolution]) -> RateSolution:
    """`solve` with max_peers, or where a peer_limit is given, without it first and with
    it only if some GPU would then have more peers than the limit.

    A runtime's real limit (MSCCL: a threadblock per peer, all resident: 130 on an
    H100) is far above the few peers max_peers asks for, and most packings stay under
    it; restricting them anyway would only cost pipeline fill. Deciding here, from the
    rate LP's structures, costs one more LP where the limit is passed; finding out from
    the lowering cost a whole synthesis (about 100 s of a 1,024-GPU compile)."""
    if not (options.max_peers and options.peer_limit):
        return solve(options)
    free = solve(replace(options, max_peers=0, peer_limit=0))
    most = most_peers(problem.network, free)
    if most <= options.peer_limit:
        return replace(free, peers_without_limit=most)
    return replace(solve(options), peers_without_limit=most, peers_limited=True)


def most_peers(net: Network, rates: RateSolution) -> int:
    """The most GPUs any GPU sends to, or receives from, over the routes of every
    structure of `rates` (those that carry no chunk count too: an upper bound)."""
    routes = np.unique(np.fromiter(chain.from_iterable(
        routes for structures in rates.shares.values() for routes, _ in structures), dtype=np.int64))
    if not len(routes):
        return 0
    n = net.ranks
    ends = np.array([(net.routes[r].src, net.routes[r].dst) for r in routes.tolist()], dtype=np.int64)
    pairs = np.unique(ends[:, 0] * n + ends[:, 1])
    return int(max(np.bincount(pairs // n, minlength=n).max(), np.bincount(pairs % n, minlength=n).max()))


"""The mix on collc's model of a cluster: where each communicator sits, what each call
costs under NCCL-style baselines, under collc's synthesized schedules and at the lower
bound, and which links carry the traffic.

Placement: global rank g runs on the topology's GPU `rank_map[g]` (launch order,
g -> g, unless a rank map says otherwise). A communicator of k ranks runs on the
sub-cluster its ranks occupy: its k GPUs (renumbered in communicator rank order) and
every switch and NIC, with the links among them; other GPUs do not forward its
traffic, as in NCCL. A Send/Recv pair is timed as a two-rank broadcast from the sender.

Timing: every call is timed alone on the alpha-beta model (collc.analysis.simulate),
and calls are summed: collectives of one iteration are assumed not to overlap.
- baseline: the fastest of the standard library's hand-written algorithms (ring, tree),
  exactly as `collc compile` reports its baselines (collc.api.baselines);
- collc: a schedule synthesized once per size band (bands split where sizes differ by
  more than BAND_RATIO) at the band's heaviest size, and simulated at each size of the
  band. Only bands that together cover COVERAGE of a (collective, communicator size)
  group's weight are synthesized; the rest keep the baseline. A band whose schedule is
  not at least MIN_GAIN faster than the baseline over its sizes keeps the baseline too
  (NCCL's fallback), so collc's total is never above the baseline's;
- bound: collc.analysis.bounds.lower_bounds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from collc import frontend
from collc.analysis.bounds import lower_bounds
from collc.analysis.simulate import Simulation, simulate
from collc.api import baselines, time_collective
from collc.diagnostics import CollcError, UsageError
from collc.ir.collective import Collective
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.limits import exceeded, int_limit
from collc.parallel import run_units
from collc.profile.mix import P2P, Mix, per_iteration

# Sizes within this factor of a band's smallest size share the band's schedule.
BAND_RATIO = 4.0
# The bands synthesized for a (collective, communicator size) cover this share of its weight.
COVERAGE = 0.95
# Solver seconds per synthesized band, and ops per rank a schedule may have: a library
# for a 20-size mix on 8 GPUs (synthesis, MSCCL XML lowering and verification of every
# file) stays under a minute on 2 cores. Lowering and verifying cost grows with ops;
# the MSCCL backend's own budget (1024 per rank) gains ~7% on the model, at 3x the time.
SYNTH_SECONDS = 2.0
OPS_PER_RANK = 256
# A band replaces NCCL only when its schedule is this much faster over the band: the
# model leaves out costs of its own (kernel launch, executor overheads) and ties in
# floating point must not produce files.
MIN_GAIN = 0.01

_MODELED = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "gather", "scatter")


@dataclass(frozen=True)
class Placement:
    """Where one communicator (or Send/Recv pair) runs: topology GPU ranks, in its rank order."""

    gpus: tuple[int, ...]
    topology: Topology


@dataclass
class SizeTiming:
    """One (collective, placement, size): job calls per iteration and the three times."""

    collective: str
    placement: Placement
    size: int
    calls_per_iteration: float
    weight: float                  # the mix's weight (measured time, else bytes) per iteration
    baseline_s: float
    baseline_name: str
    bound_s: float
    collc_s: float | None = None   # the band schedule's time; None where not synthesized
    uses_collc: bool = False       # collc's schedule is used at this size (it is faster)
    baseline_sim: Simulation | None = None
    collc_sim: Simulation | None = None

    @property
    def best_s(self) -> float:
        return self.collc_s if self.uses_collc and self.collc_s is not None else self.baseline_s


@dataclass
class Band:
    """Sizes of one (collective, communicator size) that share a synthesized schedule."""

    collective: str
    nranks: int
    sizes: list[int]
    weight: float
    covered: bool = False
    schedule: Schedule | None = None
    unit: Any = None               # the CompileUnit of its schedule
    representative: int = 0
    solver: dict[str, Any] | None = None
    error: str | None = None
    saving_s: float = 0.0          # per iteration, summed over its sizes and placements
    timings: list = field(default_factory=list)  # the SizeTimings it covers

    def withdraw(self, why: str) -> None:
        """The band cannot be used after all (e.g. beyond the executor's limits): NCCL keeps it."""
        self.error, self.saving_s = why, 0.0
        for t in self.timings:
            t.uses_collc = False

    def to_json(self) -> dict[str, Any]:
        return {"collective": self.collective, "nranks": self.nranks, "sizes": self.sizes,
                "min_bytes": min(self.sizes), "max_bytes": max(self.sizes), "covered": self.covered,
                "synthesized_at": self.representative or None,
                "method": (self.solver or {}).get("method"), "error": self.error,
                "saving_per_iteration_us": self.saving_s * 1e6}


@dataclass
class ModelResult:
    topology: str
    timings: list[SizeTiming]
    bands: list[Band]
    notes: list[str] = field(default_factory=list)
    synthesis_seconds: float = 0.0

    def total(self, which: str) -> float:
        """Seconds per iteration: 'baseline', 'collc' or 'bound'."""
        pick = {"baseline": lambda t: t.baseline_s, "collc": lambda t: t.best_s, "bound": lambda t: t.bound_s}
        return sum(pick[which](t) * t.calls_per_iteration for t in self.timings)

    def link_load(self, which: str) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, busy seconds) per link and iteration under 'baseline' or 'collc'."""
        load: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for t in self.timings:
            sim = t.collc_sim if which == "collc" and t.uses_collc else t.baseline_sim
            if sim is None:
                continue
            for link, b in sim.link_bytes.items():
                load[link][0] += b * t.calls_per_iteration
                load[link][1] += sim.link_busy_s[link] * t.calls_per_iteration
        return {k: (v[0], v[1]) for k, v in load.items()}

    def hottest_links(self, which: str, n: int = 10) -> list[dict[str, Any]]:
        total = self.total(which)
        load = self.link_load(which)
        top = sorted(load.items(), key=lambda kv: (-kv[1][1], kv[0]))[:n]
        return [{"link": f"{a}->{b}", "bytes": v[0], "busy_us": v[1] * 1e6,
                 "utilization": (v[1] / total) if total > 0 else 0.0} for (a, b), v in top if v[0] > 0]

    def to_json(self) -> dict[str, Any]:
        base, collc, bound = self.total("baseline"), self.total("collc"), self.total("bound")
        return {
            "topology": self.topology,
            "per_iteration_us": {"baseline": base * 1e6, "collc": collc * 1e6, "bound": bound * 1e6},
            "saving_per_iteration_us": (base - collc) * 1e6,
            "hottest_links": {"baseline": self.hottest_links("baseline"), "collc": self.hottest_links("collc")},
            "sizes": [{"collective": t.collective, "gpus": list(t.placement.gpus), "bytes": t.size,
                       "calls_per_iteration": t.calls_per_iteration, "baseline": t.baseline_name,
                       "baseline_us": t.baseline_s * 1e6, "collc_us": None if t.collc_s is None else t.collc_s * 1e6,
                       "uses_collc": t.uses_collc, "bound_us": t.bound_s * 1e6} for t in self.timings],
            "bands": [b.to_json() for b in self.bands],
            "synthesis_seconds": self.synthesis_seconds,
            "notes": list(self.notes),
        }


# --- placement -------------------------------------------------------------------------

def parse_rank_map(text: str) -> list[int]:
    """`"0,2,4,6,1,3,5,7"`: global rank i runs on the topology's GPU at position i."""
    try:
        ranks = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--rank-map takes comma-separated GPU numbers, got '{text}'") from None
    if len(set(ranks)) != len(ranks) or any(r < 0 for r in ranks):
        raise UsageError("--rank-map must name each GPU at most once, with numbers >= 0")
    return ranks


class Placer:
    """Global ranks -> sub-topologies, cached per GPU set."""

    def __init__(self, topology: Topology, rank_map: list[int] | None):
        self.topology = topology
        self.rank_map = rank_map
        self._cache: dict[tuple[int, ...], Placement] = {}

    def gpu_of(self, rank: int) -> int:
        if self.rank_map is not None:
            if rank >= len(self.rank_map):
                raise CollcError(f"the rank map names {len(self.rank_map)} ranks, but the trace has rank {rank}")
            gpu = self.rank_map[rank]
        else:
            gpu = rank
        if gpu >= self.topology.num_ranks:
            raise CollcError(f"rank {rank} of the job needs GPU {gpu}, but topology '{self.topology.name}' has "
                             f"{self.topology.num_ranks} GPUs (map the job onto a larger cluster, or give "
                             "--rank-map)")
        return gpu

    def place(self, ranks: tuple[int, ...]) -> Placement:
        gpus = tuple(self.gpu_of(r) for r in ranks)
        if gpus not in self._cache:
            self._cache[gpus] = Placement(gpus, self.topology.restricted_to(gpus))
        return self._cache[gpus]


# --- what to time ------------------------------------------------------------------------

def _members_of(mix: Mix, comm: str, nranks: int, notes: set[str]) -> tuple[int, ...]:
    info = mix.communicators.get(comm)
    if info is not None and info.ranks and len(info.ranks) == nranks:
        return tuple(info.ranks)
    if nranks > int_limit("ranks"):  # the readers skip such records; a last guard before range()
        raise CollcError(f"communicator {comm} has {nranks:,} ranks" + exceeded("ranks"))
    if nranks != mix.world_size:
        notes.add(f"communicator {comm}: members unknown; assumed ranks 0..{nranks - 1}")
    return tuple(range(nranks))


def demand(mix: Mix, placer: Placer) -> tuple[dict[tuple[str, tuple[int, ...], int], list[float]], list[str]]:
    """(collective, global ranks, bytes) -> [job calls per iteration, weight per iteration]."""
    iters = per_iteration(mix)
    out: dict[tuple[str, tuple[int, ...], int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    notes: set[str] = set()
    skipped: dict[str, int] = defaultdict(int)
    for j in mix.job_calls:
        f = j.first
        if f.bytes is None or f.bytes <= 0:
            skipped["size unknown"] += 1
            continue
        if j.collective in P2P:
            ends = _p2p_ends(j)
            if ends is None:
                skipped["Send/Recv with an unknown peer"] += 1
                continue
            if ends[0] == ends[1]:  # no link carries it, and a sub-cluster holds each GPU once
                skipped["Send/Recv of a rank with itself"] += 1
                continue
            key = ("broadcast", ends, f.bytes)
        elif j.collective in _MODELED:
            nranks = next((c.nranks for c in j.records if c.nranks), None) or \
                (mix.communicators[j.communicator].nranks if j.communicator in mix.communicators else None)
            if not nranks and mix.world_size:
                # No size and no group: the default process group, which spans the job.
                nranks = mix.world_size
                notes.add(f"communicator {j.communicator}: size unknown; assumed to span the job's "
                          f"{mix.world_size} ranks (the default process group)")
            if not nranks:
                skipped["communicator size unknown"] += 1
                continue
            if nranks < 2:
                continue
            key = (j.collective, _members_of(mix, j.communicator, nranks, notes), f.bytes)
        else:
            skipped[f"{j.collective} is not modeled"] += 1
            continue
        weight = j.latency_us if mix.timed else float(f.bytes)
        out[key][0] += 1 / iters
        out[key][1] += (weight or 0.0) / iters
    msgs = sorted(notes)
    if any(j.collective in P2P for j in mix.job_calls):
        msgs.append("Send/Recv pairs are timed as a two-rank broadcast from the sender")
    if any(k[0] in ("broadcast", "reduce", "gather", "scatter") for k in out):
        msgs.append("rooted collectives are timed with root 0 (traces do not record the root)")
    for why, n in sorted(skipped.items()):
        msgs.append(f"{n} job call(s) not modeled: {why}")
    return dict(out), msgs


def _p2p_ends(j) -> tuple[int, int] | None:
    for c in j.records:
        if c.rank is None or c.peer is None:
            continue
        return (c.rank, c.peer) if c.collective == "send" else (c.peer, c.rank)
    return None


def make_bands(sizes: dict[int, float], collective: str, nranks: int) -> list[Band]:
    """Sizes (-> weight) split into bands of at most BAND_RATIO from smallest to largest;
    the heaviest bands covering COVERAGE of the weight are marked covered."""
    bands: list[Band] = []
    for s in sorted(sizes):
        if bands and s <= bands[-1].sizes[0] * BAND_RATIO:
            bands[-1].sizes.append(s)
            bands[-1].weight += sizes[s]
        else:
            bands.append(Band(collective, nranks, [s], sizes[s]))
    total = sum(b.weight for b in bands)
    acc = 0.0
    for b in sorted(bands, key=lambda b: -b.weight):
        if total > 0 and acc >= COVERAGE * total:
            break
        b.covered = True
        acc += b.weight
    return bands


# --- timing ---------------------------------------------------------------------------------

def stdlib_collective(name: str, nranks: int) -> Collective:
    """The stdlib collective, as `collc compile --collective NAME` resolves it."""
    return frontend.resolve_collective(name, nranks)


def _baseline(topology: Topology, coll: Collective, size: int) -> tuple[str, float, Simulation]:
    """The fastest stdlib algorithm, as `collc compile` reports baselines, and its simulation."""
    candidates = baselines(topology, coll, size)
    timed = [b for b in candidates if b.time_s is not None]
    if not candidates:
        raise CollcError(f"no standard-library algorithm (NCCL-style baseline) for {coll.name}")
    if not timed:
        reasons = "; ".join(f"{b.name}: {b.error}" for b in candidates)
        raise CollcError(f"no standard-library algorithm for {coll.name} runs on {topology.name} ({reasons})")
    best = min(timed, key=lambda b: b.time_s)
    run = time_collective(topology, coll, size, algorithm=best.name)
    sim = run.simulation
    if sim.time_s > best.time_s * (1 + 1e-9):  # the baseline's time came from fair sharing
        sim = simulate(run.schedule, topology, size, sharing="fair")
    return best.name, best.time_s, sim


def synthesize_band(band: Band, placement: Placement, seconds: float) -> None:
    """Synthesize the band's schedule at its heaviest size (sets band.schedule or band.error)."""
    _take_synthesis(band, synthesize_unit(band.collective, band.nranks, band.representative,
                                          placement.topology, seconds))


SynthesisResult = tuple   # (unit, schedule, solver, error message or None)


def synthesize_unit(collective: str, nranks: int, size: int, topology: Topology, seconds: float
                    ) -> SynthesisResult:
    """One band's synthesis as a work unit: plain arguments in, the result back (run in a
    worker process or on a Dask worker as well as here)."""
    coll = stdlib_collective(collective, nranks)
    pipeline = f"synthesize{{method=auto time_limit={seconds:g} progress=false}}"
    try:
        run = time_collective(topology, coll, size, pipeline=pipeline, max_ops=OPS_PER_RANK * nranks)
    except CollcError as err:
        return None, None, None, err.message
    return run.unit, run.schedule, run.solver, None


def _take_synthesis(band: Band, result: SynthesisResult) -> None:
    band.unit, band.schedule, band.solver, error = result
    if error is not None:
        band.error = error


def _synthesize_all(jobs: list[tuple[Band, Placement]], seconds: float, workers: int,
                    scheduler: Any, progress: Callable[[int, int], None] | None) -> None:
    """Every band's synthesis: bands are independent, so they run in parallel (worker
    processes here, or a Dask cluster: `collc.parallel`) when there are several, with
    the same arguments and solver time limit as in one process. A band whose solver
    finishes within the limit gets the same schedule; one cut off by the limit gets
    what its solver found in that time, which depends on the CPU it had (as it does in
    one process on a busy machine): on 2 busy cores, 2 bands at once found a library
    saving 2% less."""
    units = [(b.collective, b.nranks, b.representative, p.topology, seconds) for b, p in jobs]
    for i, result in run_units(synthesize_unit, units, workers, scheduler, progress):
        _take_synthesis(jobs[i][0], result)


def model_mix(mix: Mix, topology: Topology, rank_map: list[int] | None = None,
              seconds: float = SYNTH_SECONDS, workers: int = 1, scheduler: Any = None,
              progress: Callable[[int, int], None] | None = None) -> ModelResult:
    """Time the mix per iteration on `topology` (see the module docstring)."""
    placer = Placer(topology, rank_map)
    wanted, notes = demand(mix, placer)
    timings: list[SizeTiming] = []
    unmodeled: dict[str, float] = defaultdict(float)
    for (name, ranks, size), (calls, weight) in sorted(wanted.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        placement = placer.place(ranks)
        coll = stdlib_collective(name, len(ranks))
        try:
            base_name, base_s, base_sim = _baseline(placement.topology, coll, size)
            bound = lower_bounds(placement.topology, coll, size).best_s
        except CollcError as err:
            unmodeled[f"{name} on GPUs {','.join(map(str, placement.gpus))}: {err.message}"] += calls
            continue
        timings.append(SizeTiming(name, placement, size, calls, weight, base_s, base_name, bound,
                                  baseline_sim=base_sim))
    bands = _synthesize(timings, seconds, workers, scheduler, progress)
    notes += [f"not modeled ({n:g} job calls per iteration): {why}" for why, n in sorted(unmodeled.items())]
    result = ModelResult(topology.name, timings, bands, notes)
    result.synthesis_seconds = sum((b.solver or {}).get("seconds", 0.0) for b in bands)
    return result


def _synthesize(timings: list[SizeTiming], seconds: float, workers: int = 1, scheduler: Any = None,
                progress: Callable[[int, int], None] | None = None) -> list[Band]:
    """One schedule per covered band of every (collective, communicator size), synthesized
    on the placement carrying most of the band's weight, and timed on every placement."""
    groups: dict[tuple[str, int], list[SizeTiming]] = defaultdict(list)
    for t in timings:
        groups[(t.collective, len(t.placement.gpus))].append(t)
    bands: list[Band] = []
    jobs: list[tuple[Band, Placement]] = []
    for (name, nranks), ts in sorted(groups.items()):
        per_size: dict[int, float] = defaultdict(float)
        for t in ts:
            per_size[t.size] += t.weight
        for band in make_bands(per_size, name, nranks):
            bands.append(band)
            if not band.covered:
                continue
            members = [t for t in ts if t.size in band.sizes]
            band.timings = members
            band.representative = max(band.sizes, key=lambda s: (per_size[s], s))
            by_place: dict[tuple[int, ...], float] = defaultdict(float)
            for t in members:
                by_place[t.placement.gpus] += t.weight
            home = max(members, key=lambda t: by_place[t.placement.gpus]).placement
            jobs.append((band, home))
    _synthesize_all(jobs, seconds, workers, scheduler, progress)
    for band, _home in jobs:
        members = band.timings
        if band.schedule is None:
            continue
        for t in members:
            try:
                sim = simulate(band.schedule, t.placement.topology, t.size)
            except CollcError:
                continue  # the schedule does not fit this placement's links: it keeps the baseline
            t.collc_s, t.collc_sim = sim.time_s, sim
        saving = sum((t.baseline_s - t.collc_s) * t.calls_per_iteration for t in members if t.collc_s is not None)
        # The executor takes the band's file for every size in it, or NCCL for all of
        # them: the band is used only when it saves time over all its sizes.
        baseline = sum(t.baseline_s * t.calls_per_iteration for t in members if t.collc_s is not None)
        if saving > MIN_GAIN * baseline:
            band.saving_s = saving
            for t in members:
                t.uses_collc = t.collc_s is not None
        # else: NCCL does as well or better; the band keeps the baseline and gets no file
    return bands

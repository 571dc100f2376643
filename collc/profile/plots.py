"""`--plot DIR`: the mix as pictures (PNG and SVG, matplotlib as collc.render.plots sets it up).

- sizes.png: for each collective, how its weight (measured time, or bytes where the
  trace has no times) spreads over message sizes, in power-of-two bins;
- share.png: weight per communicator, split by collective;
- links.png (with --topology): bytes per link and iteration as a heat map, source node
  by destination node, under the baseline and under collc's schedules.
Every file is written atomically.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from collc.profile.mix import Mix, human_bytes
from collc.profile.model import ModelResult
from collc.render.plots import pyplot, save_figure


def _colors() -> tuple:
    """matplotlib's tab10 palette (matplotlib is imported on the first picture)."""
    return pyplot().get_cmap("tab10").colors


def _save(fig, directory: Path, stem: str) -> list[Path]:
    out = [save_figure(fig, directory / f"{stem}.{fmt}", dpi=120, bbox_inches="tight") for fmt in ("png", "svg")]
    pyplot().close(fig)
    return out


def _unit(mix: Mix) -> tuple[str, float]:
    """Axis label and divisor for the mix's weight."""
    return ("measured time (ms)", 1e3) if mix.timed else ("bytes moved (MiB)", 2.0 ** 20)


def plot_sizes(mix: Mix, directory: Path) -> list[Path]:
    label, div = _unit(mix)
    per: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for row in mix.rows:
        if row.bytes:
            per[row.collective][int(math.log2(row.bytes))] += mix.weight(row) / div
    names = sorted(per, key=lambda c: -sum(per[c].values()))
    if not names:
        return []
    fig, axes = pyplot().subplots(len(names), 1, figsize=(8, 1.2 + 2.0 * len(names)), squeeze=False)
    lo = min(min(d) for d in per.values())
    hi = max(max(d) for d in per.values())
    for ax, name, color in zip(axes[:, 0], names, _colors() * 4):
        bins = list(range(lo, hi + 1))
        ax.bar(bins, [per[name].get(b, 0.0) for b in bins], color=color, width=0.8)
        ax.set_title(name, loc="left", fontsize=10)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(bins)
        ax.set_xticklabels([human_bytes(2 ** b) for b in bins], rotation=45, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel("message size (nccl-tests' size; bin = [2^k, 2^(k+1)))")
    fig.suptitle(f"Size distribution per collective, weighted by {'time' if mix.timed else 'bytes'}")
    fig.tight_layout()
    return _save(fig, directory, "sizes")


def plot_share(mix: Mix, directory: Path) -> list[Path]:
    label, div = _unit(mix)
    comms = list(mix.shares(lambda r: r.communicator))
    colls = list(mix.shares(lambda r: r.collective))
    if not comms:
        return []
    data = np.zeros((len(comms), len(colls)))
    for row in mix.rows:
        data[comms.index(row.communicator), colls.index(row.collective)] += mix.weight(row) / div
    fig, ax = pyplot().subplots(figsize=(8, 1.5 + 0.5 * len(comms)))
    left = np.zeros(len(comms))
    for k, (name, color) in enumerate(zip(colls, _colors() * 4)):
        ax.barh(range(len(comms)), data[:, k], left=left, color=color, label=name)
        left += data[:, k]
    labels = []
    for c in comms:
        info = mix.communicators.get(c)
        size = f"{info.nranks} ranks" if info and info.nranks else "size ?"
        role = f", {info.role}" if info and info.role != "unknown" else ""
        name = c if c != "?" else "unnamed group"  # "?": the trace names no process group
        labels.append(f"{name}\n({size}{role})")
    ax.set_yticks(range(len(comms)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(label)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{'Time' if mix.timed else 'Bytes'} per communicator and collective", loc="left")
    fig.tight_layout()
    return _save(fig, directory, "share")


def plot_links(result: ModelResult, directory: Path) -> list[Path]:
    loads = {w: result.link_load(w) for w in ("baseline", "collc")}
    nodes = sorted({n for load in loads.values() for link, (b, _) in load.items() if b > 0 for n in link},
                   key=_node_order)
    if not nodes:
        return []
    index = {n: i for i, n in enumerate(nodes)}
    mats = {}
    for which, load in loads.items():
        m = np.full((len(nodes), len(nodes)), np.nan)
        for (a, b), (byts, _) in load.items():
            if a in index and b in index:
                m[index[a], index[b]] = byts / 2 ** 20
        mats[which] = m
    vmax = max(np.nanmax(m) for m in mats.values()) or 1.0
    size = max(5.0, 0.35 * len(nodes) + 2)
    fig, axes = pyplot().subplots(1, 2, figsize=(2 * size + 1.5, size))
    titles = {"baseline": f"NCCL-style baseline: {result.total('baseline') * 1e6:,.0f} us/iter",
              "collc": f"collc schedules: {result.total('collc') * 1e6:,.0f} us/iter"}
    for ax, which in zip(axes, ("baseline", "collc")):
        im = ax.imshow(mats[which], cmap="viridis", vmin=0, vmax=vmax)
        ax.set_title(titles[which], fontsize=10)
        ax.set_xticks(range(len(nodes)))
        ax.set_yticks(range(len(nodes)))
        fs = 8 if len(nodes) <= 16 else 5
        ax.set_xticklabels(nodes, rotation=90, fontsize=fs)
        ax.set_yticklabels(nodes, fontsize=fs)
        ax.set_xlabel("to")
        ax.set_ylabel("from")
    fig.colorbar(im, ax=axes, shrink=0.8, label="MiB per iteration (blank: no link)")
    fig.suptitle(f"Link load on {result.topology}")
    return _save(fig, directory, "links")


def _node_order(name: str) -> tuple:
    """g[10] after g[9]: split digits out of names for a natural sort."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def write_plots(mix: Mix, directory: Path, model: ModelResult | None = None) -> list[Path]:
    directory = Path(directory)
    out = plot_sizes(mix, directory) + plot_share(mix, directory)
    if model is not None:
        out += plot_links(model, directory)
    return out

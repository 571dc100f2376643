"""Draw docs/images/layers.png: collc's packages by layer, with the imports between them.

The layers and the import graph come from tests/test_architecture.py (the rules the suite
enforces), so the picture shows the tree as it is:

    python3 docs/images/draw_layers.py
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import test_architecture as arch  # noqa: E402


def package_of(module: str) -> str:
    """The unit drawn: collc's second level (collc.ir, collc.driver), a tool's cli apart."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[2] == "cli" and parts[1] in ("profile", "pipeline", "harvest"):
        return f"{parts[1]}.cli"
    if module == "collc.passes.base":
        return "passes.base"
    return parts[1] if len(parts) > 1 else "collc"


def package_graph() -> tuple[dict[str, int], set[tuple[str, str]]]:
    modules = arch.module_files(arch.SOURCE_ROOTS)
    layer: dict[str, int] = {}
    edges: set[tuple[str, str]] = set()
    for module, path in modules.items():
        layer.setdefault(package_of(module), arch.layer_of(module))
        for imp in arch.imports_of(module, path, modules):
            a, b = package_of(module), package_of(imp.imported)
            if a != b:
                edges.add((a, b))
    layer.pop("__main__", None)
    return layer, {(a, b) for a, b in edges if a in layer and b in layer}


def draw(out: Path) -> None:
    layer, edges = package_graph()
    rows: dict[int, list[str]] = defaultdict(list)
    for name in sorted(layer):
        rows[layer[name]].append(name)
    position: dict[str, tuple[float, float]] = {}
    for number, names in rows.items():
        for i, name in enumerate(names):
            position[name] = ((i + 1) / (len(names) + 1) * 10, number)
    fig, ax = plt.subplots(figsize=(11, 9))
    colors = plt.get_cmap("tab20")
    for a, b in sorted(edges):
        if layer[b] == 0:
            continue  # everything reports errors through the foundation: arrows there hide the rest
        (x0, y0), (x1, y1) = position[a], position[b]
        ax.annotate("", xy=(x1, y1 + 0.18), xytext=(x0, y0 - 0.18),
                    arrowprops=dict(arrowstyle="->", color="0.75", lw=0.6, shrinkA=0, shrinkB=0))
    for name, (x, y) in position.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.3", fc=colors((2 * layer[name]) % 20), alpha=0.35, ec="0.3"))
    for number, title, _ in arch.LAYERS:
        ax.text(-0.3, number, f"{number} {title}", ha="right", va="center", fontsize=9, color="0.2")
    ax.set_xlim(-3.2, 10.2)
    ax.set_ylim(-0.6, max(layer.values()) + 0.6)
    ax.axis("off")
    ax.set_title("collc's layers: each arrow is an import between packages (those into layer 0 left out)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    draw(Path(__file__).resolve().parent / "layers.png")

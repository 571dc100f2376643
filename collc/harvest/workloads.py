"""Side tasks of the three kinds FreeRide harvests with: training a small model, a graph
algorithm, image processing. They run on NumPy (a CPU core) or CuPy (a GPU), through
`ctx.xp`, and are what `bench/bench_harvest.py` measures. Submit them like any task:

    collc harvest submit --dir D collc.harvest.workloads:PageRank --arg nodes=200000

Each keeps its data on the device between steps (to_device builds it there) and counts
its work in units that mean something: samples trained, edges relaxed, pixels filtered.
"""

from __future__ import annotations

from typing import Any

from collc.harvest.tasks import ImperativeTask, IterativeTask, TaskContext


class SmallModelTraining(IterativeTask):
    """A two-layer MLP classifier trained with SGD on a generated data set."""

    progress_unit = "samples"
    first_step_estimate_s = 0.02

    def __init__(self, ctx: TaskContext, inputs: int = 256, hidden: int = 256,
                 classes: int = 10, batch: int = 128, samples: int = 8192,
                 max_steps: int | None = None, seed: int = 0, **_: Any):
        super().__init__(ctx)
        self.shape = (inputs, hidden, classes, batch, samples)
        self.max_steps, self.seed = max_steps, seed
        self.steps_done = 0
        self.loss = float("nan")

    def to_device(self) -> None:
        xp = self.xp
        inputs, hidden, classes, _, samples = self.shape
        rng = xp.random.default_rng(self.seed) if hasattr(xp.random, "default_rng") \
            else xp.random.RandomState(self.seed)
        teacher = rng.standard_normal((inputs, classes)).astype(xp.float32)
        self.x = rng.standard_normal((samples, inputs)).astype(xp.float32)
        self.y = xp.argmax(self.x @ teacher, axis=1)
        scale = (2.0 / inputs) ** 0.5
        self.w1 = (rng.standard_normal((inputs, hidden)) * scale).astype(xp.float32)
        self.w2 = (rng.standard_normal((hidden, classes)) * (2.0 / hidden) ** 0.5
                   ).astype(xp.float32)

    def off_device(self) -> None:
        for name in ("x", "y", "w1", "w2"):
            self.__dict__.pop(name, None)

    def step(self) -> None:
        xp = self.xp
        batch, samples = self.shape[3], self.shape[4]
        lo = (self.steps_done * batch) % (samples - batch + 1)
        x, y = self.x[lo:lo + batch], self.y[lo:lo + batch]
        h = xp.maximum(x @ self.w1, 0)
        logits = h @ self.w2
        logits -= logits.max(axis=1, keepdims=True)
        p = xp.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        self.loss = float(-xp.log(p[xp.arange(batch), y] + 1e-9).mean())
        p[xp.arange(batch), y] -= 1
        p /= batch
        grad_w2 = h.T @ p
        grad_h = (p @ self.w2.T) * (h > 0)
        self.w2 -= 0.1 * grad_w2
        self.w1 -= 0.1 * (x.T @ grad_h)
        self.steps_done += 1

    def is_finished(self) -> bool:
        return self.max_steps is not None and self.steps_done >= self.max_steps

    def progress(self) -> float:
        return float(self.steps_done * self.shape[3])


class PageRank(IterativeTask):
    """PageRank by power iteration on a generated power-law graph (one step = one
    iteration over every edge); starts over on a new graph each time it converges."""

    progress_unit = "edges"
    first_step_estimate_s = 0.02

    def __init__(self, ctx: TaskContext, nodes: int = 50_000, edges_per_node: int = 8,
                 damping: float = 0.85, tol: float = 1e-8, max_steps: int | None = None,
                 seed: int = 0, **_: Any):
        super().__init__(ctx)
        self.nodes, self.edges_per_node = nodes, edges_per_node
        self.damping, self.tol, self.max_steps, self.seed = damping, tol, max_steps, seed
        self.iterations = 0
        self.edges_done = 0.0
        self.graphs = 0
        self.delta = float("inf")

    def _new_graph(self) -> None:
        xp, n = self.xp, self.nodes
        rng = xp.random.RandomState(self.seed + self.graphs)
        m = n * self.edges_per_node
        # Preferential-ish attachment: destinations drawn from a Zipf-like distribution,
        # so some pages collect many links, as on the web.
        self.src = rng.randint(0, n, size=m)
        self.dst = (n * rng.random_sample(m) ** 3).astype(xp.int64) % n
        out_degree = xp.bincount(self.src, minlength=n).astype(xp.float64)
        self.inv_out = xp.where(out_degree > 0, 1.0 / xp.maximum(out_degree, 1), 0.0)
        self.dangling = out_degree == 0
        self.rank = xp.full(n, 1.0 / n)
        self.graphs += 1

    def to_device(self) -> None:
        self._new_graph()

    def off_device(self) -> None:
        for name in ("src", "dst", "inv_out", "dangling", "rank"):
            self.__dict__.pop(name, None)

    def step(self) -> None:
        xp, n = self.xp, self.nodes
        contrib = self.rank[self.src] * self.inv_out[self.src]
        new = xp.bincount(self.dst, weights=contrib, minlength=n)
        new = self.damping * (new + self.rank[self.dangling].sum() / n) + (1 - self.damping) / n
        self.delta = float(xp.abs(new - self.rank).sum())
        self.rank = new
        self.iterations += 1
        self.edges_done += self.src.size
        if self.delta < self.tol:
            self._new_graph()

    def is_finished(self) -> bool:
        return self.max_steps is not None and self.iterations >= self.max_steps

    def progress(self) -> float:
        return self.edges_done


def _filter_image(xp: Any, image: Any) -> Any:
    """Gaussian blur (separable 5-tap) then Sobel edge magnitude."""
    k = xp.asarray([1, 4, 6, 4, 1], dtype=image.dtype) / 16
    blurred = sum(k[i] * xp.roll(image, i - 2, axis=0) for i in range(5))
    blurred = sum(k[i] * xp.roll(blurred, i - 2, axis=1) for i in range(5))
    gx = xp.roll(blurred, -1, axis=1) - xp.roll(blurred, 1, axis=1)
    gy = xp.roll(blurred, -1, axis=0) - xp.roll(blurred, 1, axis=0)
    return xp.sqrt(gx * gx + gy * gy)


class ImageFilter(IterativeTask):
    """Blur + edge-detect generated images, one image per step."""

    progress_unit = "pixels"
    first_step_estimate_s = 0.02

    def __init__(self, ctx: TaskContext, size: int = 384, max_steps: int | None = None,
                 seed: int = 0, **_: Any):
        super().__init__(ctx)
        self.size, self.max_steps, self.seed = size, max_steps, seed
        self.images = 0

    def to_device(self) -> None:
        self.rng = self.xp.random.RandomState(self.seed)

    def step(self) -> None:
        image = self.rng.random_sample((self.size, self.size)).astype(self.xp.float32)
        self.checksum = float(_filter_image(self.xp, image).mean())
        self.images += 1

    def is_finished(self) -> bool:
        return self.max_steps is not None and self.images >= self.max_steps

    def progress(self) -> float:
        return float(self.images * self.size * self.size)


class ImageFilterLoop(ImperativeTask):
    """The image filter as free-form code: a plain loop, paused and resumed by signals."""

    progress_unit = "pixels"

    def __init__(self, ctx: TaskContext, size: int = 384, images: int | None = None,
                 seed: int = 0, **_: Any):
        super().__init__(ctx)
        self.size, self.images, self.seed = size, images, seed

    def run(self) -> None:
        xp = self.xp
        rng = xp.random.RandomState(self.seed)
        done = 0
        while self.images is None or done < self.images:
            image = rng.random_sample((self.size, self.size)).astype(xp.float32)
            _filter_image(xp, image).mean()
            self.ctx.synchronize()
            done += 1
            self.ctx.report(done * self.size * self.size)

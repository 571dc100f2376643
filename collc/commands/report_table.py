"""The table `collc compile` prints for each schedule's report."""

from __future__ import annotations

from typing import Any

from collc.diagnostics import printable


def fmt_time(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 1e4:
        return f"{us / 1e3:,.2f} ms"
    return f"{us:,.2f} us"


def load_table_modules() -> None:
    """Import what `print_report` imports (rich's console and table, about 25 ms): a
    command queues this as idle work (collc.idle) where it will print a table."""
    import rich.console  # noqa: F401  (loaded here, used by print_report)
    import rich.markup  # noqa: F401
    import rich.table  # noqa: F401


def print_report(rep: dict[str, Any]) -> None:
    from rich.console import Console  # rich's tables load dozens of modules: only when one is printed
    from rich.markup import escape
    from rich.table import Table

    def safe(text: str) -> str:
        # User text (names, parameters, messages, paths) may hold `[...]` or control
        # characters: escaped, it is shown as written and neither markup nor terminal codes.
        return escape(printable(text))

    console = Console(highlight=False, emoji=False)
    solver = rep.get("solver") or {}
    title = safe(f"{rep['collective']} on {rep['topology']} ({rep['ranks']} ranks), {rep['size_bytes']:,} bytes")
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")  # long paths wrap, never cut

    def row(what: str, value: str) -> None:
        table.add_row(safe(what), safe(value))

    row("schedule time", fmt_time(rep["time_us"]))
    ratio = rep.get("ratio_to_lower_bound")
    row("lower bound", f"{fmt_time(rep['lower_bound_us'])}" + (f"  (time / bound = {ratio:.3f})" if ratio else ""))
    if rep.get("lower_bound_with_latency_us"):
        row("with latency", f"{fmt_time(rep['lower_bound_with_latency_us'])}  "
            f"(time / bound = {rep['ratio_to_bound_with_latency']:.3f})")
    row("algbw / busbw", f"{rep['algbw_GBps']:.2f} / {rep['busbw_GBps']:.2f} GB/s")
    if rep.get("demand"):
        d = rep["demand"]
        row("demand", f"{d['entries']} blocks, {d['bytes']:,.0f} bytes; moves {d['extra_share']:+.2%}"
            + (" (padded to equal blocks)" if d["padded"] else " (whole slots)"))
    for name, b in rep.get("baselines", {}).items():
        if b.get("time_us") is None:
            row(f"baseline {name}", f"n/a ({b.get('error')})")
        else:
            row(f"baseline {name}", f"{fmt_time(b['time_us'])}  (speedup {b['speedup']:.2f}x)")
    status = rep.get("optimality") or solver.get("status", "-")
    if solver.get("optimal") is False:
        status += " (not proven optimal)"
    method = solver.get("method", "-")
    nodes = solver.get("over_nodes")
    if isinstance(nodes, dict):
        method += f" over {nodes.get('nodes')} nodes"
    if solver.get("allreduce") == "direct":
        method += " (direct AllReduce)"
    row("method", f"{method}: {status}, {solver.get('seconds', 0):.2f} s")
    sched = rep.get("schedule", {})
    row("schedule", f"{sched.get('ops')} ops, {sched.get('steps')} steps, "
        f"{sched.get('chunks_per_rank')} chunk(s)/rank, verified")
    for path in rep.get("outputs", []):
        row("wrote", path)
    console.print(table)

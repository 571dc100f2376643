"""The MSCCL XML lowering passes, registered by importing this module, and the pipeline
that runs them.

    msccl-coalesce              a connection's nearby consecutive transfers as one op (only
                                where a GPU would pass the executor's 4,096 XML nodes)
    msccl-merge                 one op per run of consecutive chunks (cnt <= 71)
    msccl-threadblocks{...}     sends/receives, threadblocks, channels, in place, instances
    msccl-fuse                  rcs / rrs / rrcs
    msccl-deps                  step numbers, depid/deps/hasdep, nop steps
    msccl-assemble{...}         the XmlAlgo: proto, minBytes/maxBytes
    msccl-limits{...}           the executor's table sizes
"""

from __future__ import annotations

from collc.backends import BackendOptions
from collc.backends.msccl_xml import (  # noqa: F401
    assemble, coalesce, dependencies, fuse, limits, merge, threadblocks,
)
from collc.backends.msccl_xml.model import Protocol, XmlAlgo
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, PassManager, parse_pipeline


def lowering_pipeline(options: BackendOptions) -> str:
    """Pipeline text for the backend options."""
    try:
        proto = Protocol(options.proto)
    except ValueError:
        raise CollcError(f"unknown MSCCL protocol '{options.proto}' (known: "
                         f"{', '.join(p.value for p in Protocol)})") from None
    lo, hi = options.size_range if options.size_range is not None else (0, 0)
    channels = int(options.extra.get("channels", 0))
    steps = options.max_steps_per_tb
    return (f"msccl-coalesce,msccl-merge,"
            f"msccl-threadblocks{{instances={options.instances} inplace={'true' if options.inplace else 'false'} "
            f"channels={channels} max_steps={steps}}},"
            f"msccl-fuse,msccl-deps,"
            f"msccl-assemble{{proto={proto.value} min_bytes={lo} max_bytes={hi}}},"
            f"msccl-limits{{max_steps={steps}}}")


def lower(unit: CompileUnit, options: BackendOptions) -> CompileUnit:
    """Run the lowering pipeline; `unit.lowered` is then the XmlAlgo."""
    if unit.schedule is None:
        raise CollcError("the msccl-xml backend needs a schedule; the pipeline produced none")
    return PassManager(parse_pipeline(lowering_pipeline(options))).run(unit)


def lowered_algo(unit: CompileUnit, options: BackendOptions) -> XmlAlgo:
    """The unit's XmlAlgo, lowering it first when its lowering has not run."""
    if not isinstance(unit.lowered, XmlAlgo):
        unit = lower(unit, options)
    return unit.lowered

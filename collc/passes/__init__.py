"""Compiler passes over the IR, and the machinery that runs them."""

from collc.passes.base import (
    BUILTIN_PASS_MODULES, CompileUnit, Pass, PassManager, PipelineError, get_pass, make_pass,
    parse_pipeline, register_pass, registered_passes,
)

__all__ = [
    "BUILTIN_PASS_MODULES", "CompileUnit", "Pass", "PassManager", "PipelineError", "get_pass", "make_pass",
    "parse_pipeline", "register_pass", "registered_passes",
]

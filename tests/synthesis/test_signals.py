"""Internal "try another method" signals stay apart from user errors, and a method the
user named that does not fit is still a clear error at the entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from collc import frontend
from collc.diagnostics import CollcError, SolverError
from collc.synthesis.core import synthesize
from collc.synthesis.options import Method, SynthesisOptions
from collc.synthesis.signals import MethodDoesNotFit, NoRing, NotApplicable, NotOverNodes


@pytest.mark.parametrize("signal", [NotApplicable, NotOverNodes, NoRing])
def test_signals_are_not_user_errors(signal: type) -> None:
    # A CollcError is printed and ends the command; a signal only tells a caller to move on.
    assert issubclass(signal, MethodDoesNotFit)
    assert not issubclass(signal, CollcError)


def test_a_named_method_that_does_not_fit_is_a_solver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from collc.synthesis import auto

    def no_fit(*args, **kwargs):
        raise NotApplicable("the rate LP found no solution (planted)")

    monkeypatch.setattr(auto, "solve_rates", no_fit)
    topology = frontend.resolve_topology("ring(4)")
    collective = frontend.resolve_collective("allgather", 4)
    with pytest.raises(SolverError, match="planted"):
        synthesize(topology, collective, 1 << 20, SynthesisOptions(method=Method.STEADY, progress=False))
    # Under auto the same signal only moves synthesis on to the time-expanded methods.
    result = synthesize(topology, collective, 1 << 20, SynthesisOptions(method=Method.AUTO, progress=False))
    assert result.schedule.ops


def test_cli_words_a_named_method_that_does_not_fit(tmp_path) -> None:
    out = tmp_path / "o.json"
    proc = subprocess.run([sys.executable, "-m", "collc", "compile", "--topology", "dgx2(chassis=2)",
                           "--collective", "allreduce", "--size", "64MiB",
                           "--pipeline", "synthesize{nodes=on}", "-o", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "over the nodes of" in proc.stderr
    assert not out.exists()

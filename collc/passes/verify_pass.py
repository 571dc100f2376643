"""`verify`: the symbolic postcondition check as a pass (the pass manager also runs it
after every pass that changes the schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from collc.diagnostics import ScheduleError
from collc.passes.base import CompileUnit, Pass, register_pass
from collc.verify import verify


@register_pass
@dataclass(frozen=True)
class VerifySchedule(Pass):
    name = "verify"
    summary = "execute the schedule symbolically and check the collective's postcondition"
    races: bool = True

    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule is None:
            raise ScheduleError("nothing to verify: no pass before 'verify' produced a schedule")
        if not unit.verified:  # a schedule verified already (races checked) is not run again
            verify(unit.schedule, unit.topology, check_races=self.races)
            if self.races:
                unit = unit.with_verified(unit.schedule)
        return unit.with_note(self.name, ok=True, ops=len(unit.schedule.ops))

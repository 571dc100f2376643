"""Analysis beside the pipeline: lower bounds on completion time and an alpha-beta simulator."""

from collc.analysis.bounds import LowerBounds, cut_bound_of, lower_bounds
from collc.analysis.simulate import Sharing, Simulation, simulate

__all__ = ["LowerBounds", "Sharing", "Simulation", "cut_bound_of", "lower_bounds", "simulate"]

"""collc.harvest: run side tasks inside a pipeline-parallel trainer's bubbles.

A training script needs only `HarvestClient` (a socket, no compiler imports):

    from collc.harvest import HarvestClient
    harvest = HarvestClient(None, "cuda:0")  # None: the private default runtime directory
    with harvest.bubble("recv-activations"):
        wait_for_activations()

See docs/harvest.md for the manager, the task interfaces and the limits.
"""

from collc.harvest.client import HarvestClient, ManagerError, ManagerHandle, pin_trainer
from collc.harvest.tasks import ImperativeTask, IterativeTask, TaskContext, TaskSpec

__all__ = ["HarvestClient", "ManagerHandle", "ManagerError", "pin_trainer",
           "IterativeTask", "ImperativeTask", "TaskContext", "TaskSpec"]

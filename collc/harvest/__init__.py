"""collc.harvest: run side tasks inside a pipeline-parallel trainer's bubbles.

A training script needs only `HarvestClient` (a socket, no compiler imports):

    from collc.harvest import HarvestClient
    harvest = HarvestClient(None, "cuda:0")  # None: the private default runtime directory
    with harvest.bubble("recv-activations"):
        wait_for_activations()

See docs/harvest.md for the manager, the task interfaces and the limits.
"""


from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collc.harvest.client import HarvestClient, ManagerError, ManagerHandle, pin_trainer
    from collc.harvest.tasks import ImperativeTask, IterativeTask, TaskContext, TaskSpec

__all__ = ["HarvestClient", "ManagerHandle", "ManagerError", "pin_trainer",
           "IterativeTask", "ImperativeTask", "TaskContext", "TaskSpec"]

_CLIENT_NAMES = frozenset({"HarvestClient", "ManagerHandle", "ManagerError", "pin_trainer"})
_TASK_NAMES = frozenset({"IterativeTask", "ImperativeTask", "TaskContext", "TaskSpec"})


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: for start-up time only. Every `collc`
    command loads this package (for `collc harvest`'s parser), and the client brings
    multiprocessing and sockets with it."""
    if name in _CLIENT_NAMES:
        from collc.harvest import client as home
    elif name in _TASK_NAMES:
        from collc.harvest import tasks as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

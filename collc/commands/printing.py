"""What the commands print on standard output."""

from __future__ import annotations

import json
import sys
from typing import Any


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def json_out(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")

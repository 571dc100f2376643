import json
import math

import pytest

from collc.pipeline import report_json

VALUES = [
    {}, [], (), 0, -3, 1.5, -0.0, 1e300, 2.5e-9, math.nan, math.inf, -math.inf, True, False, None, "a\"b\\c\n\u00e9\U0001f600",
    {"a": [], "b": {}, "c": [1, 2.0, None, True, "x"], "d": {"e": {"f": [{"g": 1}, [], [[]]]}}},
    [{"start_us": 0.1 + 0.2, "cause": "warmup", "free_bytes": None, "waiting_on": "3F2 (rank 1)"}] * 3,
    {"t": (1, (2, 3), {"u": ()})},
]


@pytest.mark.parametrize("value", VALUES)
def test_the_same_text_as_json_dumps_with_indent_1(value):
    assert report_json.dumps(value) == json.dumps(value, indent=1)


def test_values_it_does_not_know_are_left_to_json_dumps():
    class Number(int):
        pass

    for value in ({1: "int key"}, [Number(3)], {"a": {None: 1}}):
        assert report_json.dumps(value) == json.dumps(value, indent=1)
    with pytest.raises(TypeError):
        report_json.dumps({"a": object()})


def test_lists_of_flat_dicts_and_their_neighbours():
    bubble = {"start_us": 1.5, "cause": "transfer", "waiting_on": "},\n  {\"x\": [1]}", "free_bytes": None}
    values = [[bubble] * 4, [bubble, {}], [bubble, {"a": [1]}], [bubble, 3], {"s": [{"b": [bubble, bubble]}]},
              [[bubble], ({"k": 1},)]]
    for value in values:
        assert report_json.dumps(value) == json.dumps(value, indent=1)

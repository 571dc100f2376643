"""`indented_json` gives json.dumps(value, indent=1)'s bytes, whichever encoder made them;
`jsontext.dumps` gives its text."""

from __future__ import annotations

import json
import math
import random

import pytest

from collc import jsontext
from collc.jsontext import WrittenList, flat_dicts_text, indented_json, list_items_text


def dumps(value) -> bytes:
    return b"".join(indented_json(value))


# Values where orjson's own text differs from json.dumps's.
AWKWARD = [1e-06, 1e16, 2e-05, 1.5, -0.0, float("nan"), float("inf"), 2**70, None, True,
           "é\x7f\u2028\U0001F600\x01\t\n\"\\/", "1e5", "a.b", [], {}, (1, 2), {"k": []}]


@pytest.fixture(autouse=True)
def small_lists(monkeypatch):
    monkeypatch.setattr(jsontext, "LONG_LIST", 2)
    monkeypatch.setattr(jsontext, "ITEMS_PER_PIECE", 3)


@pytest.mark.parametrize("value", AWKWARD, ids=repr)
def test_each_awkward_value_inside_a_long_list(value):
    doc = {"ops": [{"id": i, "v": value, "route": ["g[0]", "g[1]"]} for i in range(7)]}
    assert dumps(doc) == json.dumps(doc, indent=1).encode()


def test_keys_that_are_not_strings_are_written_as_json_dumps_writes_them():
    doc = [{1: "a", None: [1, 2, 3], 2.5: {"x": [True] * 4}, True: 0}] * 5
    assert dumps(doc) == json.dumps(doc, indent=1).encode()


def test_random_documents_match_json_dumps():
    rng = random.Random(7)

    def value(depth: int = 0):
        r = rng.random()
        if depth > 4 or r < 0.3:
            return rng.choice(AWKWARD + [1, -5, "plain", False])
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.choice([0, 1, 3, 9]))]
        return {rng.choice(["a", "ü", "k" + str(i), 1]): value(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(300):
        doc = value()
        assert dumps(doc) == json.dumps(doc, indent=1).encode()


def test_orjson_writes_the_plain_batches():
    # Integers and ASCII names: orjson's text, rewritten, is json.dumps's.
    items = [{"id": i, "src": [0, "i", i], "deps": [i - 1] if i else []} for i in range(5)]
    text = list_items_text(items, 3)
    assert text is not None
    assert text == json.dumps({"a": {"b": items}}, indent=1).encode()[len(b'{\n "a": {\n  "b": [\n'):-len(b"\n  ]\n }\n}")]


@pytest.mark.parametrize("value", [1.5, float("nan"), None, 2**70, {1: 2}])
def test_batches_orjson_could_write_otherwise_are_refused(value):
    assert list_items_text([{"v": value}], 1) is None


def test_a_written_list_is_json_dumps_of_its_items_values():
    """Batches the owner writes and batches it refuses (None) make json.dumps's text."""
    items = list(range(10))

    def to_json(i):
        return {"i": i, "half": i / 2 if i % 4 == 0 else i // 2, "tags": ["x"] * (i % 3)}

    def write(batch, level):
        if batch[0] % 2:
            return None  # refused: written from the values
        return list_items_text([to_json(i) for i in batch], level)

    doc = {"a": 1, "items": WrittenList(items, write, to_json), "z": [WrittenList([], write, to_json)]}
    plain = {"a": 1, "items": [to_json(i) for i in items], "z": [[]]}
    assert dumps(doc) == json.dumps(plain, indent=1).encode()


# --- dumps: the text as one string, by the C encoder ---------------------------

REPORT_VALUES = [
    {}, [], (), 0, -3, 1.5, -0.0, 1e300, 2.5e-9, math.nan, math.inf, -math.inf, True, False, None, "a\"b\\c\n\u00e9\U0001f600",
    {"a": [], "b": {}, "c": [1, 2.0, None, True, "x"], "d": {"e": {"f": [{"g": 1}, [], [[]]]}}},
    [{"start_us": 0.1 + 0.2, "cause": "warmup", "free_bytes": None, "waiting_on": "3F2 (rank 1)"}] * 3,
    {"t": (1, (2, 3), {"u": ()})},
]


@pytest.mark.parametrize("value", REPORT_VALUES)
def test_dumps_gives_the_text_of_json_dumps_with_indent_1(value):
    assert jsontext.dumps(value) == json.dumps(value, indent=1)


def test_dumps_leaves_values_it_does_not_know_to_json_dumps():
    class Number(int):
        pass

    for value in ({1: "int key"}, [Number(3)], {"a": {None: 1}}):
        assert jsontext.dumps(value) == json.dumps(value, indent=1)
    with pytest.raises(TypeError):
        jsontext.dumps({"a": object()})


def test_dumps_of_lists_of_flat_dicts_and_their_neighbours():
    bubble = {"start_us": 1.5, "cause": "transfer", "waiting_on": "},\n  {\"x\": [1]}", "free_bytes": None}
    values = [[bubble] * 4, [bubble, {}], [bubble, {"a": [1]}], [bubble, 3], {"s": [{"b": [bubble, bubble]}]},
              [[bubble], ({"k": 1},)]]
    for value in values:
        assert jsontext.dumps(value) == json.dumps(value, indent=1)


def test_lists_of_flat_dicts_with_floats_are_written_by_orjson_where_its_text_is_json_dumps():
    rng = random.Random(3)
    floats = [rng.random() * 10 ** rng.uniform(-8, 20) for _ in range(2000)] + [1e-4, 1e16, 0.1 + 0.2, -0.0, 0.0]
    bubbles = [{"start_us": x, "n": i, "cause": "warmup", "free_bytes": None, "ok": i % 2 == 0}
               for i, x in enumerate(floats)]
    assert jsontext.dumps({"stages": [{"bubbles": bubbles}]}) == json.dumps({"stages": [{"bubbles": bubbles}]}, indent=1)
    mid_range = [b for b in bubbles if 1e-4 <= b["start_us"] < 1e15]
    text = flat_dicts_text(mid_range, 3)
    assert text == json.dumps({"a": {"b": mid_range}}, indent=1).encode()[len(b'{\n "a": {\n  "b": [\n'):
                                                                           -len(b"\n  ]\n }\n}")]


@pytest.mark.parametrize("value", [1e-05, -9.99e-05, 1e16, 1e300, 5e-324, 1e-300])
def test_floats_orjson_writes_otherwise_are_written_again_by_repr(value):
    # Strings that look like such numbers, and keys, are left as they are.
    items = [{"a": 1.5, "v": value, "s": "x: 1e-05", "t: 1e16": "0.00001"}, {"w": -value}] * 3
    text = flat_dicts_text(items, 1)
    assert text is not None
    assert jsontext.dumps([items]) == json.dumps([items], indent=1)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2**70, [1], {"a": 1}, 1e308 * 10])
def test_flat_dicts_orjson_could_write_otherwise_are_refused(value):
    items = [{"a": 1.5, "v": value}]
    assert flat_dicts_text(items, 1) is None
    assert jsontext.dumps([items]) == json.dumps([items], indent=1)

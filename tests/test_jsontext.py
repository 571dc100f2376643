"""`indented_json` gives json.dumps(value, indent=1)'s bytes, whichever encoder made them."""

from __future__ import annotations

import json
import random

import pytest

from collc import jsontext
from collc.jsontext import WrittenList, indented_json, list_items_text


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

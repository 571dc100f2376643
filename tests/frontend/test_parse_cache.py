"""The parsed standard library, cached in the user's cache directory between runs."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from collc.frontend import parse_cache, parser
from collc.frontend.load import PRELUDE_FOLDERS, Session
from collc.frontend.module import stdlib_modules

TEXT = "topology t(n = 2) {\n    gpu g[n];\n}\n"


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(parse_cache.NO_CACHE_ENV, raising=False)
    return tmp_path / "cache" / "collc"


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{parse_cache.ENTRY_PREFIX}*{parse_cache.ENTRY_SUFFIX}"))


def refuse_parsing(monkeypatch) -> None:
    def fail(text, filename):
        raise AssertionError("parsed although the cache holds the tree")

    monkeypatch.setattr(parser, "parse", fail)


def test_a_second_parse_comes_from_the_cache(cache_home, monkeypatch):
    first = parse_cache.parse_cached(TEXT, "t.coll")
    assert stat.S_IMODE(cache_home.stat().st_mode) == 0o700
    assert len(entries(cache_home)) == 1
    refuse_parsing(monkeypatch)
    assert parse_cache.parse_cached(TEXT, "t.coll") == first


def test_another_text_or_name_is_another_entry(cache_home):
    parse_cache.parse_cached(TEXT, "t.coll")
    parse_cache.parse_cached(TEXT, "u.coll")
    parse_cache.parse_cached(TEXT + "\n", "t.coll")
    assert len(entries(cache_home)) == 3


def test_turned_off_by_the_environment(cache_home, monkeypatch):
    monkeypatch.setenv(parse_cache.NO_CACHE_ENV, "1")
    parse_cache.parse_cached(TEXT, "t.coll")
    assert not cache_home.exists()


@pytest.mark.parametrize("garbage", [b"", b"not a pickle", pickle.dumps(("another fingerprint", 1))[:-3],
                                     pickle.dumps((b"another collc", None))])
def test_a_corrupt_or_foreign_entry_is_parsed_again_and_rewritten(cache_home, garbage):
    expected = parser.parse(TEXT, "t.coll")
    parse_cache.parse_cached(TEXT, "t.coll")
    [entry] = entries(cache_home)
    entry.write_bytes(garbage)
    assert parse_cache.parse_cached(TEXT, "t.coll") == expected
    fingerprint, tree = pickle.loads(entry.read_bytes())
    assert fingerprint == parse_cache.parser_fingerprint() and tree == expected


def test_an_entry_of_another_collc_is_not_read(cache_home, monkeypatch):
    parse_cache.parse_cached(TEXT, "t.coll")
    [entry] = entries(cache_home)
    other = parser.parse("topology other() {\n    gpu g[1];\n}\n", "t.coll")
    entry.write_bytes(pickle.dumps((b"another collc", other)))
    assert parse_cache.parse_cached(TEXT, "t.coll") == parser.parse(TEXT, "t.coll")


def test_a_directory_others_may_write_is_not_used(cache_home, monkeypatch):
    cache_home.mkdir(parents=True)
    cache_home.chmod(0o777)
    parse_cache.parse_cached(TEXT, "t.coll")
    assert entries(cache_home) == []


def test_processes_that_race_leave_one_whole_entry(cache_home, tmp_path):
    script = ("from collc.frontend.parse_cache import parse_cached\n"
              f"print(len(parse_cached({TEXT!r}, 't.coll').items))\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home.parent)}
    # cwd: `python -c` puts the current directory (maybe the checkout) first on sys.path.
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, cwd=tmp_path)
             for _ in range(4)]
    assert [p.communicate()[0].strip() for p in procs] == [b"1"] * 4
    assert all(p.returncode == 0 for p in procs)
    assert len(entries(cache_home)) == 1 and not list(cache_home.glob(".*.tmp"))
    assert pickle.loads(entries(cache_home)[0].read_bytes())[1] == parser.parse(TEXT, "t.coll")


def test_the_standard_library_is_cached_and_a_users_file_is_not(cache_home, tmp_path, monkeypatch):
    user_file = tmp_path / "mine.coll"
    user_file.write_text(TEXT)
    Session().load_module(user_file)
    prelude = [name for name in stdlib_modules() if name.split(".")[0] in PRELUDE_FOLDERS]
    assert len(entries(cache_home)) == len(prelude)  # the prelude's modules; not the user's file
    before = set(entries(cache_home))
    Session().load_module(user_file)
    assert set(entries(cache_home)) == before
    ring = stdlib_modules()["topologies.ring"]
    Session().load_module(ring)
    refuse_parsing(monkeypatch)  # a fresh session: every stdlib tree from the cache
    assert Session().load_module(ring).topologies

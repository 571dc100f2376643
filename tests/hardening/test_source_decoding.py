"""Source files that are not UTF-8 are located errors; a UTF-8 byte-order mark is fine."""

from __future__ import annotations

import os
import random

import pytest

from collc import frontend
from collc.diagnostics import CollcError

from hardening_inputs import TWO_GPUS, write

VALID = f"topology t() {{ {TWO_GPUS} }}\n"


def test_latin1_comment_is_located_error_naming_byte_offset(tmp_path):
    path = write(tmp_path / "latin1.coll", b"// caf\xe9\n" + VALID.encode())
    with pytest.raises(CollcError) as info:
        frontend.check_file(path)
    err = info.value
    assert "not UTF-8" in err.message and "0xE9" in err.message and "byte offset 6" in err.message
    assert (err.span.line, err.span.column) == (1, 7)


def test_utf16_file_is_named_as_utf16(tmp_path):
    path = write(tmp_path / "u16.coll", VALID.encode("utf-16"))
    with pytest.raises(CollcError, match="UTF-16"):
        frontend.check_file(path)


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = write(tmp_path / "bom.coll", b"\xef\xbb\xbf" + VALID.encode())
    summary = frontend.check_file(path)
    assert summary.topologies and "2 GPUs" in summary.topologies[0]


def test_error_after_byte_order_mark_has_the_right_column(tmp_path):
    path = write(tmp_path / "bom.coll", b"\xef\xbb\xbftopology t() { gpu g[2] }\n")
    with pytest.raises(CollcError) as info:
        frontend.check_file(path)
    assert info.value.span.line == 1 and info.value.span.column == 25


def test_imported_module_that_is_not_utf8_is_located_in_that_module(tmp_path):
    write(tmp_path / "bad.coll", b"topology b() { gpu g[2]; } // \xff\xfe\n")
    main = write(tmp_path / "main.coll", 'import "bad.coll";\n' + VALID)
    with pytest.raises(CollcError) as info:
        frontend.check_file(main)
    assert info.value.span.file.endswith("bad.coll") and "not UTF-8" in info.value.message


def test_random_bytes_exit_1_without_traceback(collc, tmp_path):
    rng = random.Random(11)
    for k in range(5):
        write(tmp_path / f"r{k}.coll", bytes(rng.randrange(256) for _ in range(400)))
        run = collc("check", f"r{k}.coll")
        assert run.status == 1 and "error" in run.err


def test_inputs_that_are_not_regular_files_are_refused_not_read(collc, tmp_path):
    # Reading a FIFO waits for a writer forever; a device may never end.
    os.mkfifo(tmp_path / "fifo.coll")
    os.mkfifo(tmp_path / "fifo.xml")
    for argv in (["check", "fifo.coll"], ["verify", "fifo.xml"], ["check", "/dev/zero"], ["check", "."]):
        run = collc(*argv)
        assert run.status == 1 and "not a regular file" in run.err, (argv, run.err)

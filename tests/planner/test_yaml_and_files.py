"""Reading and writing the files users name: YAML 1.2 numbers, duplicate keys, limits, encodings, and
writes that never lose what was there (symlinks written through, devices and folders refused)."""

from __future__ import annotations

import dataclasses
import os
import stat
import time

import pytest

from autoplan.errors import SpecError
from autoplan.schema import TrainingSetup, load_model
from autoplan.schema._io import dump_yaml, validated
from autoplan.schema._files import check_writable, write_atomic
from autoplan.schema._yaml import YamlProblem, parse

GPT = ("name: m\narchitecture: gpt\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 256\nnum_attention_heads: 4\n"
       "num_kv_heads: 4\nvocab_size: 256\n")


@pytest.mark.parametrize("text, value", [
    ("1e9", 1e9), (".5", 0.5), ("-1.5E-3", -1.5e-3), (".inf", float("inf")), ("0x1F", 31), ("0o17", 15),
    ("017", 17), ("+3", 3), ("true", True), ("~", None),
    ("yes", "yes"), ("no", "no"), ("on", "on"), ("1_000", "1_000"), ("2024-01-01", "2024-01-01"), ("1:20", "1:20"),
])
def test_plain_scalars_follow_yaml_1_2(text, value):
    """YAML 1.2 core schema (JSON's numbers): 1e9 is a number; yes/no, 1_000 and dates are text."""
    assert parse(f"a: {text}")["a"] == value


def test_duplicate_key_names_both_lines():
    with pytest.raises(YamlProblem, match=r"duplicate key 'b' \(first on line 2\)") as err:
        parse("a: 1\nb: 2\nc: 3\nb: 4\n")
    assert err.value.line == 4
    assert parse("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n")["d"] == {"x": 1, "y": 3}  # merges may override


def test_depth_and_alias_bombs_are_refused_before_anything_is_built():
    with pytest.raises(YamlProblem, match="nested deeper than 64"):
        parse("a: " + "[" * 65 + "]" * 65)
    nested = "&a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]"
    for i in range(1, 9):
        nested = f"&a{i} [{nested}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    t0 = time.process_time()
    with pytest.raises(YamlProblem, match="expands to more than 1,000,000 values"):
        parse(f"a: {nested}")  # 9^9 = 387M zeros once expanded
    assert time.process_time() - t0 < 1.0


def test_file_problems_are_one_line(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes(GPT.replace("name: m", "name: caf\xe9").encode("latin-1"))
    (tmp_path / "big.yaml").write_text(GPT + "# " + "x" * (9 * 2**20) + "\n")
    (tmp_path / "dup.yaml").write_text(GPT + "num_layers: 200\n")
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbf" + GPT.encode())
    os.mkfifo(tmp_path / "fifo.yaml")  # reading it would block forever
    cases = {"latin1.yaml": "not UTF-8 text (byte 0xe9 at offset 9)", "big.yaml": "larger than the 8 MiB",
             "dup.yaml": "duplicate key 'num_layers' (first on line 3)", "fifo.yaml": "is a FIFO",
             ".": "is a folder", "nope.yaml": "no such file"}
    for name, message in cases.items():
        with pytest.raises(SpecError) as err:
            load_model(tmp_path / name)
        assert message in str(err.value) and "\n" not in str(err.value)
    assert load_model(tmp_path / "bom.yaml").num_layers == 2


@pytest.mark.parametrize("edit, message", [
    ("vocab_size: 256", "vocab_size: .nan"), ("hidden_size: 64", "hidden_size: 64.0"),
    ("name: m", "name: \"a\\nb\""), ("num_layers: 2", f"num_layers: {2**70}"), ("num_layers: 2", "num_layers: 20000"),
])
def test_values_are_typed_finite_and_bounded(tmp_path, edit, message):
    path = tmp_path / "m.yaml"
    path.write_text(GPT.replace(edit, message))
    with pytest.raises(SpecError) as err:
        load_model(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_floats_of_every_schema_are_finite_without_a_line_of_code(tmp_path):
    """Finiteness comes from the type (``float``), so fields added later are covered too."""
    path = tmp_path / "m.yaml"
    path.write_text(GPT + "rope_theta: -.inf\n")
    with pytest.raises(SpecError, match="rope_theta: -inf is not a finite number"):
        load_model(path)
    with pytest.raises(SpecError, match=r"--memory-margin: nan is not a finite number"):
        validated(TrainingSetup(global_batch_size=8, seq_len=32, memory_margin=float("nan")),
                  {"memory_margin": "--memory-margin"})


def test_write_atomic_writes_through_symlinks_and_keeps_the_mode(tmp_path):
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(target.name)
    write_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_write_atomic_refuses_what_it_must_not_replace(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "sub").mkdir()
    cases = {tmp_path / "fifo": "is a FIFO", tmp_path / "sub": "is a folder",
             tmp_path / "no" / "p.yaml": "does not exist; create it first", "": "empty path"}
    for path, message in cases.items():
        for fn in (check_writable, lambda p: write_atomic(p, "x")):
            with pytest.raises(SpecError) as err:
                fn(path)
            assert message in str(err.value)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    if os.geteuid() == 0:  # a device node: only root can make one
        os.mknod(tmp_path / "dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        with pytest.raises(SpecError, match="is a device"):
            write_atomic(tmp_path / "dev", "x")
        assert stat.S_ISCHR(os.lstat(tmp_path / "dev").st_mode)


def test_text_that_looks_like_a_number_round_trips(tmp_path):
    """The writer quotes exactly what a YAML 1.2 reader would take for a number or a boolean."""
    spec = dataclasses.replace(load_model("gpt-tiny"), name="1e9")
    text = dump_yaml(spec)
    assert "name: '1e9'" in text
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert load_model(path) == spec

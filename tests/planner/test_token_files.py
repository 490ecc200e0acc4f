"""Token files and their sidecars, without torch: the sidecar round-trips; every bad sidecar, a file a
model cannot read, and a missing --data for a model that is not byte-level are one line naming the key
or option and the fix; files without a sidecar are read as uint16 only where that is right, with a
notice; and nothing scans the whole file at start."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from autoplan.cli.main import main
from autoplan.errors import SpecError
from autoplan.launcher.preflight import DATA_HELP, SAMPLE_TEXT, data_path
from autoplan.schema import load_plan
from autoplan.schema.token_file import HEAD_TOKENS, TokenFileInfo, describe, read_sidecar, write_sidecar

SMALL_MODEL = """name: tiny-32k
architecture: llama
num_layers: 2
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
num_kv_heads: 4
vocab_size: 32000
seq_len: 32
"""


def token_file(path, ids, dtype="<u2", sidecar: dict | None = None):
    np.asarray(ids, dtype=dtype).tofile(path)
    if sidecar is not None:
        (path.parent / f"{path.name}.json").write_text(json.dumps(sidecar))
    return path


def one_line(err: SpecError, *needles: str) -> str:
    text = str(err)
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A byte-level plan (gpt-tiny) and one for a 32,000-token model, both for cpu-local."""
    folder = tmp_path_factory.mktemp("plans")
    (folder / "tiny-32k.yaml").write_text(SMALL_MODEL)
    made = {}
    for name, model in (("bytes", "gpt-tiny"), ("bpe", str(folder / "tiny-32k.yaml"))):
        out = folder / f"{name}.yaml"
        assert main(["plan", model, "--cluster", "cpu-local", "--global-batch-size", "8", "--seq-len", "32",
                     "--devices-per-node", "1", "--json", "-o", str(out)]) == 0
        made[name] = out
    return made


def test_sidecar_round_trip(tmp_path):
    path = token_file(tmp_path / "t.bin", np.arange(1000) * 100, dtype="<u4")
    info = TokenFileInfo("uint32", 128_256, 1000, eos_id=128_001, documents=7, tokenizer="llama3/tokenizer.json")
    write_sidecar(path, info)
    assert read_sidecar(path) == info
    assert json.loads((tmp_path / "t.bin.json").read_text())["dtype"] == "uint32"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # written through a renamed temp file
    assert read_sidecar(tmp_path / "none.bin") is None


GOOD = {"dtype": "uint16", "vocab_size": 500, "tokens": 100}


@pytest.mark.parametrize("content, needles", [
    ({**GOOD, "dtype": "int8"}, ["key 'dtype'", "'int8' is not one of uint16, uint32"]),
    ({**GOOD, "dtype": ["uint16"]}, ["key 'dtype'"]),
    ({"vocab_size": 500, "tokens": 100}, ["key 'dtype' is missing"]),
    ({**GOOD, "tokens": 99}, ["key 'tokens'", "198 bytes", "has 200", "truncated or replaced"]),
    ({**GOOD, "tokens": -1}, ["key 'tokens'", "must be in [0,"]),
    ({**GOOD, "documents": -3}, ["key 'documents'", "must be in [0, 100]"]),
    ({**GOOD, "vocab_size": 70_000}, ["key 'vocab_size'", "at most 65,536", "use dtype uint32"]),
    ({**GOOD, "vocab_size": 0}, ["key 'vocab_size'"]),
    ({**GOOD, "vocab_size": True}, ["key 'vocab_size'", "not an integer"]),
    ({**GOOD, "vocab_size": "500"}, ["key 'vocab_size'", "not an integer"]),
    ({**GOOD, "eos_id": 500}, ["key 'eos_id'", "must be in [0, 499]"]),
    ({**GOOD, "tokenizer": 3}, ["key 'tokenizer'"]),
    ({**GOOD, "dtpye": "uint16"}, ["key 'dtpye' is unknown"]),
    ([1, 2], ["a JSON list, expected an object"]),
    (b"{dtype: uint16}", ["not JSON", "line 1"]),
    (b'{"dtype": "uint16\xff"}', ["not UTF-8", "0xff"]),
])
def test_every_bad_sidecar_is_one_line_naming_the_sidecar_and_key(tmp_path, content, needles):
    path = token_file(tmp_path / "t.bin", np.zeros(100))
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    (tmp_path / "t.bin.json").write_bytes(raw)
    for check in (lambda: read_sidecar(path), lambda: describe(path, 32000, 16)):
        with pytest.raises(SpecError) as err:
            check()
        assert one_line(err.value, *needles).startswith(f"{path}.json: ")


def test_a_sidecar_vocabulary_larger_than_the_model_is_refused(tmp_path):
    path = token_file(tmp_path / "llama3.bin", np.arange(200) * 600, dtype="<u4",
                      sidecar={"dtype": "uint32", "vocab_size": 128_256, "tokens": 200})
    with pytest.raises(SpecError) as err:
        describe(path, 32_000, 16)
    one_line(err.value, "--data", "128,256", "32,000", "llama3.bin.json", "tokenize with the model's tokenizer")
    info = describe(path, 128_256, 16)  # the right model reads it as uint32, with no notice
    assert info.dtype == "uint32" and info.tokens == 200 and info.notice is None


def test_a_uint32_file_without_sidecar_is_refused_for_a_large_vocabulary(tmp_path):
    """Before, 128,256-token ids in a uint32 file were read as pairs of uint16 and trained on."""
    path = token_file(tmp_path / "ids.bin", np.arange(1000) + 100_000, dtype="<u4")
    with pytest.raises(SpecError) as err:
        describe(path, 128_256, 64)
    one_line(err.value, "--data", "no ", "ids.bin.json", "do not fit uint16", "dtype uint32")


def test_32_bit_ids_without_sidecar_are_refused_for_a_small_vocabulary(tmp_path):
    """int32/uint32 ids of a 32,000-token model all fit uint16 when read as pairs: the zero upper halves
    give them away."""
    path = token_file(tmp_path / "int32.bin", np.arange(1, 1000) % 31_000, dtype="<i4")
    with pytest.raises(SpecError) as err:
        describe(path, 32_000, 64)
    one_line(err.value, "every second id is 0", "32-bit ids", "int32.bin.json with dtype uint32")


def test_a_uint16_file_without_sidecar_is_read_with_a_notice(tmp_path):
    path = token_file(tmp_path / "nano.bin", np.arange(500) % 300)
    info = describe(path, 32_000, 16)
    assert (info.dtype, info.tokens) == ("uint16", 500)
    assert info.notice == f"reading {path} as uint16 (no {path}.json beside it; autoplan prepare-data writes one)"


@pytest.mark.parametrize("ids, dtype, vocab, needles", [
    (np.zeros(17), "<u2", 256, ["17 tokens, need at least seq_len + 2 = 18"]),
    (np.full(100, 65535), "<u2", 256, ["token id 65535 >= model.vocab_size 256", "another tokenizer"]),
    (np.zeros(101, dtype=np.uint8), "u1", 256, ["odd byte count", "dtype"]),
])
def test_files_the_model_cannot_read_are_refused(tmp_path, ids, dtype, vocab, needles):
    path = token_file(tmp_path / "t.bin", ids, dtype=dtype)
    with pytest.raises(SpecError) as err:
        describe(path, vocab, 16)
    one_line(err.value, "--data", *needles)


def test_describe_does_not_scan_the_whole_file(tmp_path):
    """Start-up cost is independent of the corpus size: 4 GiB (sparse) is described in well under a second
    (a full scan reads 4 GiB on every rank); only the first HEAD_TOKENS ids are probed."""
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    if os.stat(path).st_blocks * 512 > 1 << 20:
        pytest.skip("this file system does not keep sparse files")
    t0 = time.perf_counter()
    info = describe(path, 256, 1024)
    assert time.perf_counter() - t0 < 1.0 and info.tokens == 2 << 30
    tail = token_file(tmp_path / "tail.bin", np.r_[np.zeros(HEAD_TOKENS), [999]])
    assert describe(tail, 256, 16).tokens == HEAD_TOKENS + 1  # past the probe: the runtime's per-batch check


def test_the_shipped_sample_is_the_default_for_byte_level_models_only(plans, tmp_path, capsys):
    plan = load_plan(plans["bytes"])
    notices: list[str] = []
    assert data_path(None, plan, notices=notices) == str(SAMPLE_TEXT)
    assert len(notices) == 1 and "byte-level" in notices[0] and "shipped sample text" in notices[0]
    assert main(["run", str(plans["bytes"]), "--print-command"]) == 0
    assert f"--data {SAMPLE_TEXT}" in capsys.readouterr().out

    bpe = load_plan(plans["bpe"])
    with pytest.raises(SpecError) as err:
        data_path(None, bpe)
    one_line(err.value, "--data: model tiny-32k has a vocabulary of 32,000 tokens",
             "autoplan prepare-data makes one", "--data synthetic")
    assert data_path("synthetic", bpe) is None


def test_run_refuses_a_non_byte_level_model_without_data_in_one_line(plans, tmp_path, capsys):
    capsys.readouterr()
    assert main(["run", str(plans["bpe"]), "--print-command"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("autoplan run: error: --data: model tiny-32k has a vocabulary of 32,000 tokens")
    # with a token file of its vocabulary it starts: the command line carries the file
    path = token_file(tmp_path / "t.bin", np.arange(400) * 70, dtype="<u4",
                      sidecar={"dtype": "uint32", "vocab_size": 32000, "tokens": 400})
    assert main(["run", str(plans["bpe"]), "--print-command", "--data", str(path)]) == 0
    assert f"--data {path}" in capsys.readouterr().out
    assert main(["run", str(plans["bpe"]), "--print-command", "--data", "synthetic"]) == 0


def test_a_path_on_the_cluster_only_is_checked_by_name(plans):
    """--slurm scripts run where the file is; this host may not see it."""
    plan = load_plan(plans["bpe"])
    assert data_path("/scratch/corpus/tokens.bin", plan, on_this_host=False) == "/scratch/corpus/tokens.bin"
    with pytest.raises(SpecError):
        data_path("/scratch/corpus/tokens.bin", plan)
    with pytest.raises(SpecError) as err:
        data_path("", plan, on_this_host=False)
    one_line(err.value, "--data: empty")


def test_the_data_help_names_the_formats():
    for needle in ("uint16", "uint32", "FILE.json", "prepare-data", "synthetic", "byte-level"):
        assert needle in DATA_HELP

"""`autoplan prepare-data`: text in, a token file and sidecar out that decode back to the documents, each
followed by the end-of-text id; a seeded, disjoint held-out split of about the asked fraction; uint32 for
vocabularies beyond 16 bits; every bad input one line (exit 2) that leaves no file behind. Uses a small
byte-level BPE trained here (nothing downloaded)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from autoplan.cli import prepare_data  # noqa: E402
from autoplan.cli.main import main  # noqa: E402
from autoplan.schema.token_file import describe, read_sidecar  # noqa: E402

EOS = "<|endoftext|>"


def make_documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzäöüé"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(300)] + ["日本語", "naïve"]
    docs = []
    for i in range(count):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) for _ in range(rng.randint(1, 3))]
        docs.append(f"doc {i}: " + "\n".join(lines))
    return docs


def train_tokenizer(path, special: list[str], vocab_size: int = 500):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(make_documents(300, seed=1), trainer)
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tokenizer = train_tokenizer(folder / "tokenizer.json", [EOS])
    assert 400 <= tokenizer.get_vocab_size() <= 500
    return folder / "tokenizer.json", tokenizer


def prepare(capsys, *argv) -> tuple[int, str, str]:
    code = main(["prepare-data", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def read_tokens(path) -> np.ndarray:
    info = read_sidecar(path)
    return np.fromfile(path, dtype=info.numpy_dtype)


def split_documents(ids: np.ndarray, eos: int) -> list[list[int]]:
    assert ids[-1] == eos  # every document, the last one too, is followed by the end-of-text id
    cuts = np.flatnonzero(ids == eos)
    return [ids[a + 1 if i else 0:b].tolist() for i, (a, b) in enumerate(zip(np.r_[-1, cuts[:-1]], cuts))]


def decoded(path, tokenizer) -> list[str]:
    info = read_sidecar(path)
    return [tokenizer.decode(d) for d in split_documents(read_tokens(path), info.eos_id)]


def test_text_files_round_trip_with_a_sidecar(tok, tmp_path, capsys):
    path, tokenizer = tok
    docs = make_documents(3, seed=7)
    inputs = []
    for i, doc in enumerate(docs):
        inputs.append(tmp_path / f"doc{i}.txt")
        inputs[-1].write_text(doc, encoding="utf-8")
    out = tmp_path / "train.bin"
    code, stdout, err = prepare(capsys, *inputs, "--tokenizer", path, "-o", out)
    assert code == 0, err
    assert decoded(out, tokenizer) == docs
    info = read_sidecar(out)
    eos = tokenizer.token_to_id(EOS)
    expected = sum(len(tokenizer.encode(d, add_special_tokens=False).ids) + 1 for d in docs)
    assert (info.dtype, info.vocab_size, info.tokens, info.documents, info.eos_id) == \
        ("uint16", tokenizer.get_vocab_size(), expected, 3, eos)
    assert out.stat().st_size == 2 * expected
    summary = stdout.strip().splitlines()
    assert len(summary) == 1 and "3 documents" in summary[0] and f"{expected:,} tokens" in summary[0]
    assert "tokens/s" in summary[0] and "MB/s" in summary[0] and f"{out}.json" in summary[0]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".txt")) == ["train.bin", "train.bin.json"]
    assert describe(out, 512, 16).notice is None  # autoplan run reads it without guessing


def test_jsonl_and_split_lines_inputs_and_a_model_folder(tok, tmp_path, capsys):
    path, tokenizer = tok
    docs = make_documents(20, seed=3)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(json.dumps({"id": i, "body": d}) for i, d in enumerate(docs)) + "\n\n")
    lines = [f"line {i} ünïcode" for i in range(5)]
    txt = tmp_path / "b.txt"
    txt.write_text("\n".join(lines[:2]) + "\n\n   \n" + "\n".join(lines[2:]) + "\n")
    out = tmp_path / "mixed.bin"
    code, _, err = prepare(capsys, jsonl, txt, "--tokenizer", path.parent, "--text-key", "body", "--split-lines",
                           "-o", out)
    assert code == 0, err
    assert decoded(out, tokenizer) == docs + lines  # blank lines are no documents
    assert read_sidecar(out).documents == 25


def test_the_held_out_split_is_seeded_disjoint_and_about_the_fraction(tok, tmp_path, capsys):
    path, tokenizer = tok
    docs = make_documents(400, seed=5)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out, val = tmp_path / "t.bin", tmp_path / "t.val.bin"
    assert prepare(capsys, jsonl, "--tokenizer", path, "-o", out, "--val-fraction", "0.25")[0] == 0
    train_docs, val_docs = decoded(out, tokenizer), decoded(val, tokenizer)
    assert 0.15 * 400 <= len(val_docs) <= 0.35 * 400
    assert sorted(train_docs + val_docs) == sorted(docs) and not set(train_docs) & set(val_docs)
    assert read_sidecar(val).documents == len(val_docs) and read_sidecar(out).documents == len(train_docs)
    first = val.read_bytes()
    assert prepare(capsys, jsonl, "--tokenizer", path, "-o", out, "--val-fraction", "0.25")[0] == 0
    assert val.read_bytes() == first  # the same documents again
    assert prepare(capsys, jsonl, "--tokenizer", path, "-o", out, "--val-fraction", "0.25", "--seed", "1")[0] == 0
    assert val.read_bytes() != first


def test_a_vocabulary_beyond_16_bits_is_written_as_uint32(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(128_255)} | {"</s>": 128_255}
    big = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    big.save(str(tmp_path / "big.json"))
    (tmp_path / "in.txt").write_text("w5 w128000 w70000 w65536")
    out = tmp_path / "big.bin"
    assert prepare(capsys, tmp_path / "in.txt", "--tokenizer", tmp_path / "big.json", "-o", out)[0] == 0
    info = read_sidecar(out)
    assert (info.dtype, info.vocab_size, info.eos_id) == ("uint32", 128_256, 128_255)
    assert read_tokens(out).tolist() == [5, 128_000, 70_000, 65_536, 128_255]


def test_progress_lines_into_a_pipe(tok, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(prepare_data, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(prepare_data, "BATCH_DOCS", 10)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in make_documents(50)))
    code, _, err = prepare(capsys, jsonl, "--tokenizer", tok[0], "-o", tmp_path / "p.bin")
    assert code == 0
    lines = err.splitlines()
    assert len(lines) >= 4 and "\r" not in err and all("tokens/s" in line for line in lines)


def one_line_refusal(capsys, tmp_path, argv, *needles):
    before = set(tmp_path.iterdir())
    code, out, err = prepare(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("autoplan prepare-data: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert set(tmp_path.iterdir()) == before  # no output, no temporary file left


def test_bad_inputs_are_one_line_and_leave_nothing(tok, tmp_path, capsys):
    path, _ = tok
    good = tmp_path / "good.txt"
    good.write_text("hello world")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))
    nokey = tmp_path / "nokey.jsonl"
    nokey.write_text('{"content": "x"}\n')
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n')
    no_eos = tmp_path / "noeos.json"
    train_tokenizer(no_eos, [])
    (tmp_path / "folder").mkdir()
    (tmp_path / "data.csv").write_text("a,b\n")
    out = tmp_path / "out.bin"
    cases = [
        ([tmp_path / "missing.txt"], ["missing.txt: no such file"]),
        ([tmp_path / "data.csv"], ["unknown input type '.csv'", ".jsonl"]),
        ([good, latin1], ["latin1.txt: not UTF-8 (byte 0xe9 at offset 3)", "save it as UTF-8"]),
        ([nokey], ["nokey.jsonl line 1: no 'text' field", "'content'", "--text-key"]),
        ([broken], ["broken.jsonl line 2: not JSON"]),
        ([good, "--val-fraction", "1"], ["--val-fraction: 1.0 must be in [0, 1)"]),
        ([good, "--eos-id", "100000"], ["--eos-id: 100000 must be in [0,"]),
        ([good, "--tokenizer", tmp_path / "folder"], ["a folder without tokenizer.json"]),
        ([good, "--tokenizer", good], ["not a tokenizers tokenizer.json"]),
        ([good, "--tokenizer", no_eos], ["no end-of-text token", "pass --eos-id N"]),
        ([good, "-o", good], ["is the input"]),
    ]
    for argv, needles in cases:
        extra = [] if "--tokenizer" in argv else ["--tokenizer", path]
        extra += [] if "-o" in argv else ["-o", out]
        one_line_refusal(capsys, tmp_path, [*argv, *extra], *needles)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        (tmp_path / "d.parquet").write_bytes(b"PAR1")
        one_line_refusal(capsys, tmp_path, [tmp_path / "d.parquet", "--tokenizer", path, "-o", out],
                         "pip install pyarrow")
    # the tokenizer with no end-of-text token works once told which id ends a document
    assert prepare(capsys, good, "--tokenizer", no_eos, "--eos-id", "7", "-o", out)[0] == 0
    assert read_sidecar(out).eos_id == 7 and read_tokens(out)[-1] == 7


def test_a_missing_tokenizers_library_is_one_line(tok, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)  # import tokenizers -> ImportError
    (tmp_path / "a.txt").write_text("hello")
    one_line_refusal(capsys, tmp_path, [tmp_path / "a.txt", "--tokenizer", tok[0], "-o", tmp_path / "o.bin"],
                     "pip install tokenizers")

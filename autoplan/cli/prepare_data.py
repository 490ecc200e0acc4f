"""``autoplan prepare-data INPUT... --tokenizer PATH -o OUT.bin``: text to a token file for ``autoplan run --data``.

Why here: without it, a user with text and a Hugging Face tokenizer had to write a script, pick a width
(uint16 cannot hold Llama-3's 128,256 ids) and hope the runtime read the same. This command writes the
token file and its sidecar ``OUT.json`` (autoplan/schema/token_file.py), which says the width, the
vocabulary and the count, so ``autoplan run`` reads exactly what was written.

Inputs: ``.txt`` (a file is one document; ``--split-lines``: each non-empty line is one), ``.jsonl`` (the
``--text-key`` string of each line) and ``.parquet`` (that column; needs pyarrow). The tokenizer is a local
``tokenizer.json`` (or a model folder holding one) read with the ``tokenizers`` library: nothing is
downloaded. Each document is followed by the end-of-text id (``--eos-id``, else the tokenizer's own
``</s>``, ``<|endoftext|>``, ``<|end_of_text|>`` or ``<eos>``), as nanoGPT and Megatron-LM write it, so
every boundary is marked, also where two files are concatenated. Ids are uint16 when the vocabulary
fits (<= 65,536), else uint32.

Streaming: documents are read one at a time, encoded in batches of a few MB (``encode_batch``, on all
cores) and appended to temporary files beside the outputs, which are renamed over ``OUT`` (and
``OUT.val.bin``) at the end, then the sidecars are written; an interrupted run leaves no partial output.
A corpus larger than memory works as ``.jsonl``, ``.parquet`` or ``--split-lines`` text; a ``.txt``
document is read whole (at most ``MAX_DOCUMENT_BYTES``). ``--val-fraction`` holds out documents chosen
by a seeded hash of their index (the same documents for the same inputs and ``--seed``).

Progress and throughput go to stderr every ~2 s (one line redrawn on a terminal, plain lines into a
pipe); the summary goes to stdout. ``tokenizers``, numpy and pyarrow are imported inside ``run``, so
``autoplan --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.schema._files import check_writable, regular_file
from autoplan.schema.limits import MAX_TEXT_CHARS
from autoplan.schema.token_file import DTYPES, TokenFileInfo, dtype_for, write_sidecar

KINDS = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")
BATCH_CHARS = 4 << 20
"""Characters encoded per ``encode_batch`` call: large enough to keep every core busy, small in memory."""
BATCH_DOCS = 8192
MAX_DOCUMENT_BYTES = 1 << 30
"""A whole-file ``.txt`` document larger than this is refused (it would be read into memory at once)."""
PROGRESS_EVERY_S = 2.0
_M64 = (1 << 64) - 1


def register(subparsers) -> None:
    p = subparsers.add_parser("prepare-data", help="tokenize text (.txt, .jsonl, .parquet) into a token file for "
                              "autoplan run --data", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt (one document per file, or per line with "
                   "--split-lines), .jsonl (one JSON object per line) or .parquet files")
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a tokenizer.json, or a model folder holding one (read locally; nothing is downloaded)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.bin",
                   help="the token file to write; its sidecar OUT.bin.json is written beside it")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="fraction of the documents held out into OUT.val.bin (default 0: none)")
    p.add_argument("--seed", type=int, default=0, help="which documents are held out (default 0)")
    p.add_argument("--text-key", default="text", help="the field holding the text in .jsonl and .parquet "
                   "inputs (default text)")
    p.add_argument("--split-lines", action="store_true", help=".txt inputs: each non-empty line is a document")
    p.add_argument("--eos-id", type=int, help="the id written after each document (default: the tokenizer's "
                   f"{', '.join(EOS_NAMES)})")
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------------------ inputs
def _check_inputs(names: list[str], outputs: list[str]) -> list[tuple[Path, str]]:
    """Every input a readable regular file of a known kind, none of them an output: before any work."""
    out = []
    for name in names:
        p = Path(name)
        regular_file(p, name, "an input: .txt, .jsonl or .parquet")
        kind = KINDS.get(p.suffix.lower())
        if kind is None:
            raise SpecError(f"{name}: unknown input type {p.suffix or '(no suffix)'!r}; give .txt, .jsonl or "
                            ".parquet files")
        if kind == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError:
                raise SpecError(f"{name}: reading .parquet needs pyarrow: pip install pyarrow (or convert it to "
                                ".jsonl)") from None
        for output in outputs:
            if os.path.exists(output) and os.path.samefile(name, output):
                raise SpecError(f"-o {output}: is the input {name}; choose another output file")
        out.append((p, kind))
    return out


def _not_utf8(where: str, raw: bytes, err: UnicodeDecodeError) -> SpecError:
    return SpecError(f"{where}: not UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start}); save it as UTF-8")


def _text_documents(path: Path, split_lines: bool) -> Iterator[tuple[str, int]]:
    if not split_lines:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise SpecError(f"{path}: {size / 1e9:.1f} GB as one document; pass --split-lines (a document per "
                            "non-empty line) or give .jsonl")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise _not_utf8(str(path), raw, err) from None
        if text.strip():
            yield text, len(raw)
        return
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise _not_utf8(f"{path} line {number}", raw, err) from None
            if line.strip():
                yield line, len(raw)


def _jsonl_documents(path: Path, key: str) -> Iterator[tuple[str, int]]:
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{path} line {number}"
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(where, raw, err) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as err:
                why = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deep"
                raise SpecError(f"{where}: not JSON ({why}); a .jsonl file holds one JSON object per line") from None
            if not isinstance(obj, dict):
                raise SpecError(f"{where}: a JSON {type(obj).__name__}, expected an object with a {key!r} field")
            if key not in obj:
                keys = ", ".join(repr(k) for k in list(obj)[:8])
                raise SpecError(f"{where}: no {key!r} field (its fields: {keys or 'none'}); pass --text-key")
            text = obj[key]
            if not isinstance(text, str):
                raise SpecError(f"{where}: {key!r} is a JSON {type(text).__name__}, expected a string")
            if text:
                yield text, len(raw)


def _parquet_documents(path: Path, key: str) -> Iterator[tuple[str, int]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError) on a file that is not Parquet
        raise SpecError(f"{path}: not a Parquet file ({str(err).splitlines()[0][:200]})") from None
    names = table.schema_arrow.names
    if key not in names:
        raise SpecError(f"{path}: no {key!r} column (its columns: {', '.join(map(repr, names[:8]))}); pass --text-key")
    for batch in table.iter_batches(columns=[key], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text is None:
                continue
            if not isinstance(text, str):
                raise SpecError(f"{path}: column {key!r} holds {type(text).__name__} values, expected strings")
            if text:
                yield text, len(text.encode("utf-8"))


def documents(inputs: list[tuple[Path, str]], split_lines: bool, key: str) -> Iterator[tuple[str, int]]:
    """(text, bytes read) of every document of every input, in order, one at a time."""
    for path, kind in inputs:
        if kind == "text":
            yield from _text_documents(path, split_lines)
        elif kind == "jsonl":
            yield from _jsonl_documents(path, key)
        else:
            yield from _parquet_documents(path, key)


# --------------------------------------------------------------------------------------- tokenizer
def load_tokenizer(spec: str):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json or a folder holding one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SpecError("--tokenizer: reading a tokenizer needs the tokenizers library: "
                        "pip install tokenizers") from None
    p = Path(spec)
    if p.is_dir():
        p = p / "tokenizer.json"
        if not p.is_file():
            raise SpecError(f"--tokenizer {spec}: a folder without tokenizer.json; give a Hugging Face tokenizer.json "
                            "(sentencepiece .model files are not read)")
    elif not p.exists():
        raise SpecError(f"--tokenizer {spec}: no such file or folder (a tokenizer.json, or a model folder holding one)")
    elif not p.is_file():
        raise SpecError(f"--tokenizer {spec}: not a regular file (a tokenizer.json, or a model folder holding one)")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as err:  # tokenizers raises a bare Exception for any file it cannot parse
        reason = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise SpecError(f"--tokenizer {p}: not a tokenizers tokenizer.json ({reason})") from None


def end_of_text(tokenizer, eos_id: int | None, vocab: int, spec: str) -> tuple[int, str]:
    """The id written after each document, and what it is (for the summary)."""
    if eos_id is not None:
        if not 0 <= eos_id < vocab:
            raise SpecError(f"--eos-id: {eos_id} must be in [0, {vocab - 1}] (the tokenizer's vocabulary)")
        return eos_id, repr(tokenizer.id_to_token(eos_id))
    for name in EOS_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return found, repr(name)
    raise SpecError(f"--tokenizer {spec}: no end-of-text token ({', '.join(EOS_NAMES)}); pass --eos-id N, the id "
                    "written after each document")


# ------------------------------------------------------------------------------------------ outputs
def val_path(output: str) -> str:
    """``tokens.bin`` -> ``tokens.val.bin``; another name gets ``.val`` appended."""
    return output[:-4] + ".val.bin" if output.endswith(".bin") else output + ".val"


class TokenSink:
    """Ids appended to a temporary file beside ``path``; ``commit`` renames it over ``path`` and writes
    the sidecar, ``discard`` removes it (nothing half-written is ever under the user's name)."""

    def __init__(self, path: str, np_dtype: str) -> None:
        self.path, self.np_dtype = path, np_dtype
        target = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
        self.target = target
        fd, self.tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        self.file = os.fdopen(fd, "wb")
        self.tokens = self.documents = 0

    def add(self, ids, documents: int) -> None:
        self.file.write(ids.tobytes())
        self.tokens += len(ids)
        self.documents += documents

    def commit(self, info: TokenFileInfo) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)
        os.replace(self.tmp, self.target)
        write_sidecar(self.path, info)

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        Path(self.tmp).unlink(missing_ok=True)


def held_out(index: int, seed: int, fraction: float) -> bool:
    """Whether document ``index`` goes to the validation file: a splitmix64 hash of (seed, index) below
    ``fraction`` of its range, so the choice needs no pass over the data and no memory."""
    if fraction <= 0:
        return False
    x = ((seed & _M64) * 0x9E3779B97F4A7C15 + index + 0x632BE59BD9B4E019) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) < fraction * 2.0**64


class Progress:
    """Documents, tokens and throughput on stderr every ``PROGRESS_EVERY_S``: one redrawn line on a
    terminal, plain lines into a pipe or a log."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self.last = time.monotonic()
        self.drawn = False

    def line(self, docs: int, tokens: int, nbytes: int) -> str:
        took = max(time.monotonic() - self.start, 1e-9)
        return (f"{docs:,} documents, {tokens:,} tokens from {nbytes / 1e6:,.1f} MB in {took:.1f} s "
                f"({nbytes / 1e6 / took:,.1f} MB/s, {tokens / took:,.0f} tokens/s)")

    def update(self, docs: int, tokens: int, nbytes: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        text = f"autoplan prepare-data: {self.line(docs, tokens, nbytes)}"
        self.stream.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


# -------------------------------------------------------------------------------------------- run
def _check_numbers(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.val_fraction) and 0 <= args.val_fraction < 1):
        raise SpecError(f"--val-fraction: {args.val_fraction} must be in [0, 1), e.g. 0.01 for 1% of the documents")
    if args.text_key == "":
        raise SpecError("--text-key: empty; give the field that holds the text (default text)")
    if len(args.tokenizer) > MAX_TEXT_CHARS:
        raise SpecError(f"--tokenizer: a path of more than {MAX_TEXT_CHARS:,} characters")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    _check_numbers(args)
    val = val_path(args.output) if args.val_fraction > 0 else None
    inputs = _check_inputs(args.inputs, [args.output] + ([val] if val else []))
    if val is not None:
        check_writable(val, "-o")
    tokenizer = load_tokenizer(args.tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos, eos_name = end_of_text(tokenizer, args.eos_id, vocab, args.tokenizer)
    dtype = dtype_for(vocab)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # fast: no offsets (tokenizers >= 0.20)

    sinks = [TokenSink(args.output, DTYPES[dtype])]
    if val is not None:
        sinks.append(TokenSink(val, DTYPES[dtype]))
    progress = Progress()
    count = nbytes = 0
    batch: list[tuple[int, str]] = []
    chars = 0

    def flush() -> None:
        encodings = encode([text for _, text in batch], add_special_tokens=False)
        held = [held_out(index, args.seed, args.val_fraction) for index, _ in batch]
        for which, sink in enumerate(sinks):
            mine = [e.ids for e, h in zip(encodings, held) if h == bool(which)]
            if not mine:
                continue
            ids = np.empty(sum(map(len, mine)) + len(mine), dtype=DTYPES[dtype])
            at = 0
            for one in mine:
                ids[at:at + len(one)] = one
                ids[at + len(one)] = eos
                at += len(one) + 1
            sink.add(ids, len(mine))
        batch.clear()

    try:
        for text, size in documents(inputs, args.split_lines, args.text_key):
            batch.append((count, text))
            count, nbytes, chars = count + 1, nbytes + size, chars + len(text)
            if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCS:
                flush()
                chars = 0
                progress.update(count, sum(s.tokens for s in sinks), nbytes)
        if batch:
            flush()
        progress.close()
        if count == 0:
            raise SpecError(f"{args.inputs[0]}: no documents in the inputs (empty, or only blank lines)")
        name = args.tokenizer[:MAX_TEXT_CHARS]
        for sink in sinks:
            sink.commit(TokenFileInfo(dtype, vocab, sink.tokens, eos, sink.documents, name))
    except BaseException:
        progress.close()
        for sink in sinks:
            sink.discard()
        raise
    tokens = sum(s.tokens for s in sinks)
    wrote = f"wrote {args.output} and {args.output}.json ({dtype}, vocabulary {vocab:,}, end-of-text {eos} {eos_name})"
    if val is not None:
        wrote += (f"; held out {sinks[1].documents:,} documents ({sinks[1].tokens:,} tokens) in {val} and "
                  f"{val}.json")
    print(f"autoplan prepare-data: {progress.line(count, tokens, nbytes)}; {wrote}", flush=True)
    return 0

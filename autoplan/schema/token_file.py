"""Token files: a flat little-endian array of token ids, described by a JSON sidecar ``FILE.json``.

Why a sidecar: a bare ``.bin`` (nanoGPT's format) says nothing about itself, so the runtime guessed
uint16 -- and a uint32 file of Llama-3 ids (128,256 tokens do not fit 16 bits) was read as pairs of
uint16 and trained, on garbage, without a word. The sidecar says the width (``dtype``), the vocabulary
the ids come from (``vocab_size``), how many ids there are (``tokens``: the file's size must agree, which
catches a truncated copy or a sidecar left beside another file), and optionally the separator
(``eos_id``), the number of ``documents`` and the ``tokenizer`` that made it. ``autoplan prepare-data``
writes both files.

The rule (``describe``): with a sidecar its dtype is used and its vocabulary must fit the model's; without
one, a file is read as uint16 (nanoGPT's files keep working) only when the model's ids fit 16 bits, and
the caller prints a notice saying so; anything else is refused in one line naming the fix. Nothing here
scans the whole file (a 100 GB corpus would cost minutes on every rank at every start): the sidecar's
vocabulary is trusted, the first ``HEAD_TOKENS`` ids are probed (a wrong tokenizer shows at once), and
the runtime checks each batch's largest id as it reads it.

Torch-free, and numpy is imported only where a file is probed, so ``autoplan --help`` stays light.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.schema._files import read_bytes, regular_file, write_atomic
from autoplan.schema.limits import MAX_TEXT_CHARS, MAX_VOCAB_SIZE

DTYPES = {"uint16": "<u2", "uint32": "<u4"}
"""The widths a token file may have, and their numpy (little-endian) type codes."""
ITEMSIZE = {"uint16": 2, "uint32": 4}
UINT16_VOCAB = 2**16
"""The largest vocabulary whose ids fit uint16 (ids 0..65,535)."""
MAX_SIDECAR_BYTES = 1 << 20
"""A sidecar holds a handful of numbers; anything larger is not one."""
HEAD_TOKENS = 1 << 20
"""Ids probed at the start of a file by ``describe`` (2-4 MiB read): enough to catch a wrong tokenizer."""
MAX_TOKENS = 1 << 50
"""More ids than any disk holds; bounds the ``tokens`` and ``documents`` counts against typos."""
KEYS = ("dtype", "vocab_size", "tokens", "eos_id", "documents", "tokenizer")
REQUIRED = ("dtype", "vocab_size", "tokens")


@dataclass(frozen=True)
class TokenFileInfo:
    """What a token file holds. ``notice``: a line for the user when it was read without a sidecar (never
    written to the sidecar)."""

    dtype: str
    vocab_size: int
    tokens: int
    eos_id: int | None = None
    documents: int | None = None
    tokenizer: str | None = None
    notice: str | None = None

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def numpy_dtype(self) -> str:
        return DTYPES[self.dtype]


def sidecar_path(path: str | os.PathLike) -> Path:
    """``tokens.bin`` -> ``tokens.bin.json``: beside the file, so copying both keeps them together."""
    return Path(f"{os.fspath(path)}.json")


def dtype_for(vocab_size: int) -> str:
    """The narrowest width that holds every id of a vocabulary."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


def _int(side: Path, data: dict, key: str, low: int, high: int, why: str) -> int | None:
    value = data.get(key)
    if value is None and key not in REQUIRED:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{side}: key '{key}': {value!r} is not an integer; {why}")
    if not low <= value <= high:
        raise SpecError(f"{side}: key '{key}': {value:,} must be in [{low:,}, {high:,}]; {why}")
    return value


def read_sidecar(path: str | os.PathLike) -> TokenFileInfo | None:
    """The validated sidecar of token file ``path`` (None when there is none): every key of the right
    type and range, and the token file's size equal to ``tokens`` x the dtype's width."""
    side = sidecar_path(path)
    if not os.path.lexists(side):
        return None
    raw = read_bytes(side, MAX_SIDECAR_BYTES, f"the JSON sidecar of {path}", "a token-file sidecar")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{side}: not UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start}); a sidecar is "
                        "JSON text") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        where = f" (line {err.lineno} column {err.colno}: {err.msg})" if isinstance(err, json.JSONDecodeError) else ""
        raise SpecError(f"{side}: not JSON{where}; fix it or rewrite it with autoplan prepare-data") from None
    if not isinstance(data, dict):
        raise SpecError(f"{side}: a JSON {type(data).__name__}, expected an object with keys {', '.join(REQUIRED)}")
    for key in data:
        if key not in KEYS:
            raise SpecError(f"{side}: key {str(key)[:80]!r} is unknown; the keys are {', '.join(KEYS)}")
    for key in REQUIRED:
        if key not in data:
            raise SpecError(f"{side}: key '{key}' is missing; a sidecar needs {', '.join(REQUIRED)} "
                            "(autoplan prepare-data writes it)")
    dtype = data["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SpecError(f"{side}: key 'dtype': {str(dtype)[:80]!r} is not one of {', '.join(DTYPES)}; give the "
                        "width of the file's little-endian ids")
    top = UINT16_VOCAB if dtype == "uint16" else MAX_VOCAB_SIZE
    why = (f"the {dtype} file's ids must come from a vocabulary of at most {top:,} (use dtype uint32 for larger ones)"
           if dtype == "uint16" else "the tokenizer's vocabulary size")
    vocab = _int(side, data, "vocab_size", 1, top, why)
    tokens = _int(side, data, "tokens", 0, MAX_TOKENS, "the number of ids in the file")
    eos = _int(side, data, "eos_id", 0, vocab - 1, "the id that separates documents, below vocab_size")
    documents = _int(side, data, "documents", 0, tokens, "the number of documents, at most the number of tokens")
    tokenizer = data.get("tokenizer")
    if tokenizer is not None and (not isinstance(tokenizer, str) or len(tokenizer) > MAX_TEXT_CHARS):
        raise SpecError(f"{side}: key 'tokenizer': expected a string of at most {MAX_TEXT_CHARS:,} characters "
                        "(what made the file)")
    try:
        size = Path(path).stat().st_size
    except OSError as err:
        raise SpecError(f"{side}: its token file {path} cannot be read ({err.strerror})") from None
    if size != tokens * ITEMSIZE[dtype]:
        raise SpecError(f"{side}: key 'tokens': {tokens:,} {dtype} ids are {tokens * ITEMSIZE[dtype]:,} bytes but "
                        f"{path} has {size:,}; the file was truncated or replaced (rewrite both with autoplan "
                        "prepare-data)")
    return TokenFileInfo(dtype, vocab, tokens, eos, documents, tokenizer)


def write_sidecar(path: str | os.PathLike, info: TokenFileInfo) -> None:
    """Write ``path``'s sidecar atomically (a crash leaves the old one or the new one, never half)."""
    data = {k: v for k, v in asdict(info).items() if k in KEYS and v is not None}
    write_atomic(sidecar_path(path), json.dumps(data, indent=2) + "\n", "sidecar")


def _head(path: str | os.PathLike, numpy_dtype: str, count: int):
    import numpy as np

    try:
        return np.fromfile(path, dtype=numpy_dtype, count=count)
    except OSError as err:
        raise SpecError(f"--data {path}: cannot read ({err.strerror})") from None


def _looks_32_bit(head) -> bool:
    """uint32 (or int32, numpy's default) ids read as uint16: every second value is a zero upper half.
    Real uint16 token streams never have id 0 at every odd position over hundreds of ids."""
    return head.size >= 256 and not head[1::2].any() and bool(head[0::2].any())


def describe(path: str | os.PathLike, vocab_size: int, seq_len: int) -> TokenFileInfo:
    """How to read token file ``path`` for a model of ``vocab_size`` ids and sequences of ``seq_len``
    (see the module's docstring for the rule); one SpecError line when it cannot train that model."""
    p = Path(path)
    st = regular_file(p, f"--data {path}", "a token file; autoplan prepare-data makes one")
    side = sidecar_path(path)
    info = read_sidecar(path)
    if info is not None:
        if info.vocab_size > vocab_size:
            raise SpecError(f"--data {path}: its ids come from a vocabulary of {info.vocab_size:,} tokens ({side} "
                            f"vocab_size) but the model has {vocab_size:,}; tokenize with the model's tokenizer or "
                            f"train a model with vocab_size >= {info.vocab_size:,}")
    else:
        if vocab_size > UINT16_VOCAB:
            raise SpecError(f"--data {path}: no {side} beside it, and the model's {vocab_size:,} ids do not fit "
                            f"uint16; write {side} with dtype uint32 (and vocab_size, tokens), or make the file "
                            "with autoplan prepare-data")
        if st.st_size % 2:
            raise SpecError(f"--data {path}: odd byte count, so not uint16 ids; write {side} with its dtype, or "
                            "make the file with autoplan prepare-data")
        info = TokenFileInfo("uint16", vocab_size, st.st_size // 2,
                             notice=f"reading {path} as uint16 (no {side} beside it; autoplan prepare-data writes one)")
    need = seq_len + 2
    if info.tokens < need:
        raise SpecError(f"--data {path}: {info.tokens:,} tokens, need at least seq_len + 2 = {need:,}; give a longer "
                        "token file or a shorter seq_len")
    head = _head(path, info.numpy_dtype, min(info.tokens, HEAD_TOKENS))
    if info.notice is not None and _looks_32_bit(head):
        raise SpecError(f"--data {path}: read as uint16 (no {side} beside it), every second id is 0: these look like "
                        f"32-bit ids; write {side} with dtype uint32 (and vocab_size, tokens), or make the file with "
                        "autoplan prepare-data")
    top = int(head.max()) if head.size else 0
    if top >= vocab_size:
        fix = (f"{side} does not describe this file (dtype or vocab_size), or it was made with another tokenizer"
               if side.exists() else f"it was made with another tokenizer, or it is not uint16 (write {side})")
        raise SpecError(f"--data {path}: token id {top} >= model.vocab_size {vocab_size} (in its first "
                        f"{min(info.tokens, HEAD_TOKENS):,} ids); {fix}")
    return info


def windows(tokens: int, seq_len: int) -> int:
    """Training windows of ``seq_len + 1`` ids (inputs and next-token targets) a file of ``tokens`` ids holds,
    window i being ids [i*T, (i+1)*T + 1): consecutive windows share one id, so none is wasted."""
    return max(0, (tokens - 1) // seq_len)


def describe_eval(path: str | os.PathLike, vocab_size: int, seq_len: int, wanted: int, flag: str = "--data",
                  option: str = "--sequences") -> TokenFileInfo:
    """``describe`` for a file whose first ``wanted`` windows are evaluated in order (``autoplan eval``,
    ``autoplan run --eval-data``), which must hold that many; errors name ``flag`` and ``option``."""
    if wanted < 1:
        raise SpecError(f"{option}: {wanted} must be at least 1")
    try:
        info = describe(path, vocab_size, seq_len)
    except SpecError as err:
        raise SpecError(str(err).replace("--data", flag, 1)) from None
    have = windows(info.tokens, seq_len)
    if wanted > have:
        raise SpecError(f"{option}: {wanted:,} windows of seq_len {seq_len} + 1 ids asked for, but {flag} {path} holds "
                        f"{have:,}; ask for at most {have:,} or give a longer file")
    return info

"""A Hugging Face model folder as the runtime sees it, and the checks ``--init-from`` gets before any
process starts. Torch-free: the launcher's preflight runs it, and so does every rank of runtime.launch.

The tensors of a folder are read from the safetensors headers alone (safetensors' format: an 8-byte
little-endian header length, then a JSON object ``name -> {dtype, shape, data_offsets}``), so a check of
a 140 GB folder reads a few hundred KiB. A sharded folder (``model-0000X-of-0000Y.safetensors``) is
found through ``model.safetensors.index.json``'s ``weight_map``; an unsharded one is ``model.safetensors``.
``pytorch_model.bin`` (pickles) is not read: ``transformers`` converts it (``save_pretrained(...,
safe_serialization=True)``).

Each mistake is one SpecError line naming ``--init-from``, the file or key, and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec
from autoplan.schema.hf_config import spec_from_hf_config
from runtime.hf.names import family, resolve_key, stored_shapes

INDEX, SINGLE, CONFIG = "model.safetensors.index.json", "model.safetensors", "config.json"
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
"""The float dtypes a weight may be stored in (cast to the parameter's dtype on load), and their sizes."""
MAX_HEADER_BYTES = 100 * 2**20
"""safetensors' own limit on the JSON header."""
MAX_INDEX_BYTES = 64 * 2**20
SPEC_FIELDS_IGNORED = ("name", "seq_len", "dropout", "make_vocab_size_divisible_by", "max_positions",
                       "sliding_window", "activation")
"""ModelSpec fields a folder's model may differ in from the plan's: names and training choices, and the
three checked differently (gpt's position rows against the stored table, the window against the
training sequence, the activation through ``mlp_activation``, where None means the default)."""


@dataclass(frozen=True)
class Stored:
    """One tensor of the folder: the file holding it, its safetensors dtype and shape."""

    file: str
    dtype: str
    shape: tuple[int, ...]


def _header(path: Path, flag: str) -> dict:
    """The JSON header of one safetensors file, checked against the file's size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
                raise SpecError(f"{flag}: {path}: not a safetensors file (header length {n} in a file of "
                                f"{size} bytes); save the model with safe_serialization=True")
            raw = f.read(n)
    except OSError as err:
        raise SpecError(f"{flag}: {path}: cannot read ({err.strerror})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SpecError(f"{flag}: {path}: the safetensors header is not JSON (a damaged or truncated file); "
                        "download or save it again") from None
    if not isinstance(header, dict):
        raise SpecError(f"{flag}: {path}: the safetensors header is not an object (a damaged file)")
    data_bytes = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
            dtype = str(entry["dtype"])
        except (KeyError, TypeError, ValueError):
            raise SpecError(f"{flag}: {path}: tensor {name!r} has a damaged header entry") from None
        if end > data_bytes:
            raise SpecError(f"{flag}: {path}: tensor {name!r} ends at byte {end:,} of {data_bytes:,} (a truncated "
                            "file); download or save it again")
        if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise SpecError(f"{flag}: {path}: tensor {name!r} has {end - begin:,} bytes for shape {list(shape)} "
                            f"{dtype} (a damaged file)")
    return header


def stored_tensors(folder: str | os.PathLike, flag: str = "--init-from") -> dict[str, Stored]:
    """Every tensor of the folder's safetensors files (through the index when there is one)."""
    root = Path(folder)
    index = root / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = {str(k): str(v) for k, v in weight_map.items()}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise SpecError(f"{flag}: {index}: not a safetensors index (a JSON object with a weight_map "
                            "of tensor -> file); save the model again") from None
    elif (root / SINGLE).is_file():
        files = None
    else:
        bins = sorted(p.name for p in root.glob("*.bin"))
        hint = (f" ({bins[0]} is a pickle: load it with transformers and save_pretrained(..., "
                "safe_serialization=True))") if bins else ""
        raise SpecError(f"{flag}: {root}: no {SINGLE} or {INDEX}; give a folder saved by transformers' "
                        f"save_pretrained{hint}")
    out: dict[str, Stored] = {}
    for file in sorted(set(files.values())) if files is not None else [SINGLE]:
        path = root / file
        if os.sep in file or file in ("", ".", "..") or not path.is_file():
            raise SpecError(f"{flag}: {index}: lists {file!r}, which is not a file in {root}; download the "
                            "missing shard or save the model again")
        for name, entry in _header(path, flag).items():
            if name != "__metadata__" and (files is None or files.get(name) == file):
                out[name] = Stored(file, str(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
    missing = [k for k, f in (files or {}).items() if k not in out]
    if missing:
        raise SpecError(f"{flag}: {index}: maps {missing[0]!r} to {files[missing[0]]}, which does not hold it "
                        "(a damaged index); save the model again")
    return out


def check_tensors(folder: str | os.PathLike, spec: ModelSpec, seq_len: int | None,
                  flag: str = "--init-from") -> dict[str, str]:
    """Every tensor the runtime's model of ``spec`` reads is in the folder with the right shape and a float
    dtype; returns our key -> the folder's key (``names.resolve_key``). An MoE model no family of ours
    maps (``names.moe_family``) is one line naming ``flag``."""
    mapped(spec, flag)
    stored = stored_tensors(folder, flag)
    found: dict[str, str] = {}
    for key, shape in stored_shapes(spec, seq_len).items():
        actual = resolve_key(key, stored)
        if actual is None:
            raise SpecError(f"{flag}: {folder}: tensor {key!r} is missing (a {spec.architecture} model of this "
                            f"shape has it); {_fix_for_missing(key, stored)}")
        got = stored[actual]
        where = f"{flag}: {Path(folder) / got.file}: tensor {actual!r}"
        if got.dtype not in DTYPE_BYTES:
            raise SpecError(f"{where} is {got.dtype}, not a float dtype ({', '.join(DTYPE_BYTES)}); give "
                            "unquantised weights")
        rows_ok = key.endswith("wpe.weight") and len(got.shape) == 2 and got.shape[1] == shape[1] \
            and got.shape[0] >= shape[0]  # a longer position table: the runtime keeps its first rows
        if got.shape != shape and not rows_ok:
            raise SpecError(f"{where} has shape {list(got.shape)}, the plan's model needs {list(shape)}; give "
                            "the folder of the plan's model, or plan for this one (autoplan plan "
                            f"{Path(folder) / CONFIG})")
        found[key] = actual
    return found


def _fix_for_missing(key: str, stored: dict[str, Stored]) -> str:
    """The fix for a missing tensor: a complete folder, or, for a folder holding transformers 5's in-memory
    fused experts (``experts.gate_up_proj``: a state_dict written without ``save_pretrained``, which
    writes the Hub's one tensor per expert), saving it with ``save_pretrained``."""
    if ".experts." in key and any(k.endswith("experts.gate_up_proj") for k in stored):
        return ("the folder holds fused experts (experts.gate_up_proj, transformers 5's in-memory layout); load it "
                "with transformers and save_pretrained it, which writes one tensor per expert")
    return "give a complete folder of the plan's model"


def _differences(folder_spec: ModelSpec, spec: ModelSpec) -> list[str]:
    out = []
    for field in dataclasses.fields(ModelSpec):
        if field.name in SPEC_FIELDS_IGNORED:
            continue
        a, b = getattr(folder_spec, field.name), getattr(spec, field.name)
        if a != b:
            out.append(f"{field.name} {a} in the folder, {b} in the plan")
    if folder_spec.mlp_activation != spec.mlp_activation:
        out.append(f"activation {folder_spec.mlp_activation} in the folder, {spec.mlp_activation} in the plan")
    return out


def check_init_folder(folder: str | os.PathLike, spec: ModelSpec, seq_len: int,
                      flag: str = "--init-from") -> dict[str, str]:
    """Everything about ``folder`` that can be known before a process starts: a folder with a
    ``config.json`` describing the plan's model (names, the training sequence, dropout may differ), and
    every tensor the model reads, of the right shape and a float dtype. Returns ``check_tensors``' map."""
    root = Path(folder)
    if str(folder) == "":
        raise SpecError(f"{flag}: empty path; give a Hugging Face model folder (config.json + model.safetensors)")
    if not root.is_dir():
        what = "no such folder" if not root.exists() else "not a folder"
        raise SpecError(f"{flag} {folder}: {what}; give a Hugging Face model folder (config.json + "
                        "model.safetensors)")
    config = root / CONFIG
    if not config.is_file():
        raise SpecError(f"{flag} {folder}: no {CONFIG}; give a folder saved by transformers' save_pretrained")
    try:
        folder_spec = spec_from_hf_config(config, name=spec.name)
    except SpecError as err:
        raise SpecError(f"{flag}: {err}") from None
    diffs = _differences(folder_spec, spec)
    if diffs:
        more = f" (and {len(diffs) - 2} more)" if len(diffs) > 2 else ""
        raise SpecError(f"{flag}: {config} describes another model than the plan's {spec.name!r}: "
                        f"{'; '.join(diffs[:2])}{more}; plan for this folder (autoplan plan {config} ...) or "
                        "give the folder of the plan's model")
    if folder_spec.sliding_window is not None and seq_len > folder_spec.sliding_window:
        raise SpecError(f"{flag}: {config}: the model attends over a window of {folder_spec.sliding_window} tokens "
                        f"and the runtime's full causal attention equals it only up to that; use --seq-len "
                        f"{folder_spec.sliding_window} or less (now {seq_len})")
    return check_tensors(root, spec, seq_len, flag)


def mapped(spec: ModelSpec, flag: str) -> None:
    """``names.family``'s refusal of ``spec`` (an MoE model no Hugging Face family of ours computes) as
    one line naming ``flag``."""
    try:
        family(spec)
    except SpecError as err:
        raise SpecError(f"{flag}: {err}") from None


def check_output(out: str | os.PathLike, force: bool, flag: str = "OUT_DIR", can_force: bool = True,
                 spec: ModelSpec | None = None) -> None:
    """One line now, rather than after the export, if the folder ``out`` cannot be written: an existing
    non-empty folder only with ``force`` (``can_force``: the command has a --force); with ``spec``, a
    model no Hugging Face family of ours computes (``--save-hf`` would find out only after training)."""
    if spec is not None:
        mapped(spec, flag)
    path = Path(out)
    if str(out) == "":
        raise SpecError(f"{flag}: empty path; give a folder to create")
    if path.exists() and not path.is_dir():
        raise SpecError(f"{flag} {path}: is a file, not a folder; give a folder to create")
    if path.is_dir() and any(path.iterdir()) and not force:
        fix = "choose a new folder" + (", or pass --force to replace it" if can_force else "")
        raise SpecError(f"{flag} {path}: exists and is not empty; {fix}")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise SpecError(f"{flag} {path}: its parent {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise SpecError(f"{flag} {path}: cannot write in {parent}")

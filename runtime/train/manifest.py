"""What makes a checkpoint folder trustworthy: the COMPLETE marker holds a manifest of every file in it
(bytes and SHA-256) and the model it was written for; a checkpoint is used only if its files still match.

Torch-free on purpose: ``autoplan run`` reads manifests in its preflight (which checkpoint a restart
resumes from, whether it fits the plan) without importing torch. SHA-256 because anyone can check a
file by hand (``sha256sum``) and it runs at ~1-2 GB/s per core; the ranks hash their shares in parallel
(``integrity.py``). A COMPLETE file that is not JSON was written before manifests existed: such a
checkpoint is used unverified.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
FORMAT = 1
_STEP_DIR = re.compile(r"^step_([0-9]+)$")


@dataclass(frozen=True)
class Manifest:
    step: int
    model_sha256: str
    """Of the plan's model spec (canonical JSON): a checkpoint loads only into the same model shape."""
    layout: dict[str, Any]
    files: dict[str, tuple[int, str]]
    """File name -> (bytes, SHA-256 hex) for every file of the folder except COMPLETE itself."""
    training: dict[str, Any] = field(default_factory=dict)
    """The run's training knobs (TrainingSetup.knobs(): learning rate, schedule, seed...); empty in
    manifests written before they were recorded."""
    model: dict[str, Any] | None = None
    """The plan's model spec as written in the plan (``to_dict``), so that ``autoplan export-hf`` knows the
    model from the checkpoint alone; None in manifests written before it was recorded (export then
    needs ``--plan``)."""


def model_fingerprint(model_dict: dict) -> str:
    return hashlib.sha256(json.dumps(model_dict, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path, chunk_bytes: int = 1 << 22) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def manifest_text(manifest: Manifest) -> str:
    return json.dumps({"format": FORMAT, "step": manifest.step, "model_sha256": manifest.model_sha256,
                       "layout": manifest.layout, "training": manifest.training,
                       **({"model": manifest.model} if manifest.model is not None else {}),
                       "files": {n: {"bytes": b, "sha256": d} for n, (b, d) in sorted(manifest.files.items())}},
                      indent=1) + "\n"


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest in ``folder/COMPLETE``; None for a checkpoint written before manifests (plain step number).
    Raises ValueError when COMPLETE is JSON but not a manifest (a damaged marker)."""
    text = (folder / MARKER).read_text(errors="replace")
    if text.strip().isdigit():
        return None
    try:
        data = json.loads(text)
        files = {str(n): (int(v["bytes"]), str(v["sha256"])) for n, v in data["files"].items()}
        model = data.get("model")
        return Manifest(int(data["step"]), str(data["model_sha256"]), dict(data["layout"]), files,
                        dict(data.get("training", {})), dict(model) if model is not None else None)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{MARKER} is not a checkpoint manifest ({type(err).__name__})") from None


def check_files(folder: Path, manifest: Manifest, names: list[str]) -> str | None:
    """The first problem with ``names`` (a share of the manifest's files), or None if they all match."""
    for name in names:
        path = folder / name
        want_bytes, want_sha = manifest.files[name]
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want_bytes:
            return f"{name} has {size} bytes, the manifest says {want_bytes}"
        if file_digest(path)[1] != want_sha:
            return f"{name} does not match its SHA-256 (the file was changed after the save)"
    return None


def complete_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every ``step_N`` folder with a COMPLETE marker, newest first. Unfinished saves
    (``step_N.tmp``) and folders without the marker are not checkpoints."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        match = _STEP_DIR.match(p.name)
        if match and p.is_dir() and (p / MARKER).is_file():
            found.append((int(match.group(1)), p))
    return sorted(found, reverse=True)

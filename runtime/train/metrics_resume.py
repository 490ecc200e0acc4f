"""A resumed run continues the metrics file without repeating or missing a step.

A run that saved at step 10 and died at step 13 left rows 1-13; its resume from step 10 writes rows
11-... again. So before the first resumed step, rank 0 keeps only rows up to the checkpoint's step (and
drops a last line cut short by the crash), rewriting the file atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

from autoplan.schema._io import write_atomic


def trim_after(path: str, step: int) -> None:
    """Keep the rows of steps 1..``step`` of a JSON-lines metrics file; a missing file stays missing."""
    p = Path(path)
    if not p.is_file():
        return
    kept = []
    for line in p.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short when the previous attempt died
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + "\n")
    write_atomic(p, "".join(kept), what="--metrics")

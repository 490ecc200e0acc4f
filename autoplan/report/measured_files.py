"""The files ``autoplan run`` leaves for ``autoplan compare`` -- the metrics JSON lines (runtime/train/metrics.py)
and the measured step trace's merged.json (runtime/train/trace_phases.py) -- read and checked before
anything uses them.

They are user input like any other: a row edited by hand, a file of another run, a binary file, NaN or
``true`` in a number's place. Every row and every traced rank is checked (``check_row``,
``check_trace_ranks``): a damaged file is one SpecError line naming the file, the line and the field.
Torch-free.
"""

from __future__ import annotations

import json
import math
import reprlib
from pathlib import Path
from typing import Any

from autoplan.errors import SpecError
from autoplan.schema._files import decode_utf8
from autoplan.schema.fingerprint import FINGERPRINT_CHARS, FINGERPRINT_KEY
from autoplan.schema.limits import MAX_DEVICES, MAX_STEPS
from autoplan.schema.trace import MEASURED_TERMS, SPEED_PROBE_KEY, TRACE_FORMAT

MERGED_TRACE = "merged.json"
UTF8_FIX = "autoplan run writes UTF-8 JSON"

# What a metrics row may hold (runtime/train/metrics.py ``MetricsLog.record`` writes them). The runtime
# rounds seconds and GiB to 6 decimals, tokens/s to 2 and probe times to 3: a positive value below that
# resolution is not one it wrote (and would blow relative errors up to inf). The upper bounds are far
# beyond any real run.
MIN_STEP_TIME_S, MAX_STEP_TIME_S = 1e-6, 1e6
MAX_PEAK_GIB = 1e6
"""About 1 PiB on one rank."""
MAX_TOKENS_PER_S = 1e15
MIN_PROBE_US, MAX_PROBE_US = 1e-3, 1e9
_HEX = set("0123456789abcdef")
_FIX = "fix or delete the line (autoplan run --metrics writes these files)"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 4, 4, 30, 30, 30


def _show(value: Any) -> str:
    """A value for a one-line message as the JSON file spells it (true, null, NaN), bounded."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = json.dumps(value)
    else:
        text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a finite number (bool, text, NaN, inf, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _number(where: str, key: str, value: Any, what: str, low: float, high: float, zero: bool = False,
            fix: str = _FIX) -> float:
    """A finite number in [low, high] (or exactly 0 where ``zero``), else a SpecError naming ``key``."""
    x = _as_number(value)
    if x is None or not (low <= x <= high or (zero and x == 0)):
        rng = f"0 or {low:g} to {high:g}" if zero else f"{low:g} to {high:g}"
        raise SpecError(f"{where}: {key}: got {_show(value)}, expected {what} ({rng}); {fix}")
    return x


def _read_bytes(p: Path, what: str) -> bytes:
    try:
        return p.read_bytes()
    except OSError as err:
        raise SpecError(f"{what}{p}: cannot read ({err.strerror or type(err).__name__})") from None


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics file, each checked (``check_row``), steps in order, one per-rank width."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"{path}: no such metrics file (autoplan run --metrics writes one)")
    if not p.is_file():
        raise SpecError(f"{path}: not a regular file; give the metrics file autoplan run --metrics wrote")
    text = decode_utf8(_read_bytes(p, ""), str(p), UTF8_FIX)
    rows: list[dict] = []
    first_line = 0
    width: tuple[int, int] | None = None  # (values per rank, the line that set it)
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)  # ValueError: not JSON, or an int of more than 4300 digits
        except RecursionError:
            raise SpecError(f"{where}: not a JSON line (nested too deeply); {_FIX}") from None
        except ValueError:
            raise SpecError(f"{where}: not a JSON line") from None
        if not isinstance(row, dict):
            raise SpecError(f"{where}: expected a JSON object (one step's metrics), got {_show(row)}; {_FIX}")
        check_row(row, where)
        if rows and row["step"] <= rows[-1]["step"]:
            raise SpecError(f"{where}: step: {row['step']} after step {rows[-1]['step']}; the steps of one run go up "
                            "line by line: give each run its own --metrics file")
        per_rank = row.get("peak_memory_gib_per_rank")
        if per_rank is not None:
            if width is None:
                width = (len(per_rank), n)
            elif len(per_rank) != width[0]:
                values = f"{len(per_rank)} value{'s' * (len(per_rank) != 1)}"
                raise SpecError(f"{where}: peak_memory_gib_per_rank: {values}, line {width[1]} has {width[0]}; every "
                                "row has one value per rank of the same run")
        if rows and row.get(FINGERPRINT_KEY) != rows[0].get(FINGERPRINT_KEY):
            raise SpecError(f"{where}: {FINGERPRINT_KEY}: {_show(row.get(FINGERPRINT_KEY))}, line {first_line} has "
                            f"{_show(rows[0].get(FINGERPRINT_KEY))}; the rows come from runs of different plans: give "
                            "each run its own --metrics file")
        first_line = first_line or n
        rows.append(row)
    if not rows:
        raise SpecError(f"{path}: no steps recorded")
    return rows


def check_row(row: dict, where: str) -> None:
    """One metrics row against what the runtime writes; SpecError naming ``where`` (file:line) and the field.
    Keys the comparison does not read (lr, grad_norm, predicted_*, peak_reserved_gib) are not checked."""
    if "step_time_s" not in row:
        raise SpecError(f"{where}: step_time_s: missing; is this a metrics file of autoplan run?")
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_STEPS:
        raise SpecError(f"{where}: step: got {_show(step) if 'step' in row else 'nothing'}, expected a whole number "
                        f"1 to {MAX_STEPS:g}; {_FIX}")
    _number(where, "step_time_s", row["step_time_s"], "seconds", MIN_STEP_TIME_S, MAX_STEP_TIME_S)
    if row.get("tokens_per_s") is not None:
        _number(where, "tokens_per_s", row["tokens_per_s"], "tokens per second or null", 0.01, MAX_TOKENS_PER_S,
                zero=True)
    if "loss" in row:
        x = _as_number(row["loss"])
        if x is None:
            raise SpecError(f"{where}: loss: got {_show(row['loss'])}, expected a finite number (the runtime stops "
                            f"on a non-finite loss); {_FIX}")
    if "peak_memory_gib" in row:
        _number(where, "peak_memory_gib", row["peak_memory_gib"], "GiB", 1e-6, MAX_PEAK_GIB, zero=True)
    if "peak_memory_gib_per_rank" in row:
        per_rank = row["peak_memory_gib_per_rank"]
        if not isinstance(per_rank, list) or not per_rank or len(per_rank) > MAX_DEVICES:
            raise SpecError(f"{where}: peak_memory_gib_per_rank: got {_show(per_rank)}, expected a list of one peak "
                            f"in GiB per rank; {_FIX}")
        for i, g in enumerate(per_rank):
            _number(where, f"peak_memory_gib_per_rank[{i}]", g, "GiB", 1e-6, MAX_PEAK_GIB, zero=True)
    if "profiled" in row and not isinstance(row["profiled"], bool):
        raise SpecError(f"{where}: profiled: got {_show(row['profiled'])}, expected true or false; {_FIX}")
    if SPEED_PROBE_KEY in row:
        probe = row[SPEED_PROBE_KEY]
        if not isinstance(probe, dict):
            raise SpecError(f"{where}: {SPEED_PROBE_KEY}: got {_show(probe)}, expected "
                            '{"gemm_us": .., "op_us": ..} (runtime/train/speed_probe.py); ' + _FIX)
        for key in ("gemm_us", "op_us"):
            if key not in probe:
                raise SpecError(f"{where}: {SPEED_PROBE_KEY}.{key}: missing; {_FIX}")
            _number(where, f"{SPEED_PROBE_KEY}.{key}", probe[key], "microseconds", MIN_PROBE_US, MAX_PROBE_US)
    if FINGERPRINT_KEY in row:
        fp = row[FINGERPRINT_KEY]
        if not (isinstance(fp, str) and len(fp) == FINGERPRINT_CHARS and set(fp) <= _HEX):
            raise SpecError(f"{where}: {FINGERPRINT_KEY}: got {_show(fp)}, expected {FINGERPRINT_CHARS} hex digits "
                            f"(autoplan.schema.fingerprint); {_FIX}")


def read_measured_trace(path: str | Path) -> dict[str, Any]:
    """otherData.autoplan of a measured step trace: ``path`` is the trace folder or the merged file; what
    ``_measured_split`` reads is checked (``check_trace_ranks``)."""
    p = Path(path)
    p = p / MERGED_TRACE if p.is_dir() else p
    if not p.is_file():
        raise SpecError(f"--trace: {p}: no such file (autoplan run --trace DIR writes DIR/{MERGED_TRACE})")
    text = decode_utf8(_read_bytes(p, "--trace: "), f"--trace: {p}", UTF8_FIX)
    not_trace = f"--trace: {p}: not a step trace written by autoplan run --trace"
    try:
        info = json.loads(text)["otherData"]["autoplan"]
    except RecursionError:
        raise SpecError(f"{not_trace} (JSON nested too deeply)") from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise SpecError(not_trace) from None
    if not isinstance(info, dict) or info.get("format") != TRACE_FORMAT or info.get("source") != "measured":
        raise SpecError(f"--trace: {p}: expected a measured step trace of format {TRACE_FORMAT}")
    check_trace_ranks(info, f"--trace: {p}: otherData.autoplan")
    return info


def check_trace_ranks(info: dict[str, Any], where: str) -> None:
    """``info["ranks"]``: {"<global rank>": {pp_rank, dp_rank, tp_rank[, cp_rank]: ints >= 0, terms_s: {term:
    finite seconds}, steps: a list of {"step": int >= 1, ...}, step_time_s: > 0 (0 where no step was traced)[, mode]}}
    (runtime/train/trace_phases.py ``merged_trace`` writes it)."""
    fix = "re-record it with autoplan run --trace DIR"
    ranks = info.get("ranks")
    if not isinstance(ranks, dict):
        raise SpecError(f"{where}.ranks: got {_show(ranks)}, expected a map of rank to its numbers; {fix}")
    for key, r in ranks.items():
        at = f"{where}.ranks.{key if key.isascii() and key.isprintable() and len(key) <= 20 else _show(key)}"
        if not (key.isdigit() and key.isascii() and len(key) <= 9):
            raise SpecError(f"{at}: the key must be a global rank number; {fix}")
        if not isinstance(r, dict):
            raise SpecError(f"{at}: got {_show(r)}, expected a map; {fix}")
        for name in ("pp_rank", "dp_rank", "tp_rank", "cp_rank"):
            v = r.get(name, 0) if name == "cp_rank" else r.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_DEVICES:
                raise SpecError(f"{at}.{name}: got {_show(v)}, expected a rank number >= 0; {fix}")
        terms = r.get("terms_s")
        if not isinstance(terms, dict):
            raise SpecError(f"{at}.terms_s: got {_show(terms)}, expected a map of term to seconds; {fix}")
        for t in MEASURED_TERMS:
            if t in terms:
                _number(f"{at}.terms_s", t, terms[t], "seconds", -MAX_STEP_TIME_S, MAX_STEP_TIME_S, fix=fix)
        steps = r.get("steps")
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            raise SpecError(f"{at}.steps: got {_show(steps)}, expected a list of traced steps; {fix}")
        # a rank that traced no step has a step time of 0 (and is refused if it is the one compared)
        _number(at, "step_time_s", r.get("step_time_s"), "seconds", MIN_STEP_TIME_S, MAX_STEP_TIME_S,
                zero=not steps, fix=fix)
        for i, s in enumerate(steps):
            v = s.get("step")
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_STEPS:
                raise SpecError(f"{at}.steps[{i}].step: got {_show(v)}, expected a step number >= 1; {fix}")
        if not isinstance(r.get("mode", "host"), str):
            raise SpecError(f"{at}.mode: got {_show(r['mode'])}, expected \"host\" or \"device\"; {fix}")

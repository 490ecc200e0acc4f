"""Every script in benchmarks/ stays runnable: each one with options answers ``--help`` (exit 0), and every
one imports (its main guarded), so a renamed function or a moved constant fails here rather than on the
day someone runs the benchmark (issue 30: run_vs_serial.py failed on import and nothing caught it).
The benchmarks themselves are not run: they take minutes to hours and print figures for a person."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
WITH_OPTIONS = [p for p in SCRIPTS if "argparse" in p.read_text()]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("script", WITH_OPTIONS, ids=lambda p: p.name)
def test_help(script):
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=ENV,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_every_script_imports():
    """One process imports them all (``runpy`` with another ``__name__``, so no main runs)."""
    code = ("import runpy, sys\n"
            "for path in sys.argv[1:]:\n"
            "    runpy.run_path(path, run_name='imported')\n")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, SCRIPTS)], capture_output=True, text=True, env=ENV,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(SCRIPTS) >= 19

"""The per-node command lines `autoplan run` prints for a multi-node plan are real: two `autoplan run
--nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT` on one machine form one 4-rank job (two "nodes" of
2 gloo ranks, runtime-notes §10) whose losses equal the same plan run as one node of 4 ranks, bit for bit
(the same ranks in the same layout: the same reductions in the same order). Which node gets rank 0 is
the rendezvous' choice; ranks stay contiguous per node either way."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from autoplan.cli.main import main
from rt_launcher import ROOT

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_like_one(tmp_path):
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "gpt-tiny", "--cluster", "cpu-local", "--nodes", "2", "--devices-per-node", "2",
                 "--global-batch-size", "8", "--seq-len", "32", "--pp", "2", "--dp", "2", "--zero-stage", "0",
                 "--schedule", "1f1b", "--json", "-o", str(plan)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "autoplan.cli.main", "run", str(plan), "--steps", "4", "--data", "synthetic"]
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen([*common, "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", endpoint,
                               "--metrics", str(tmp_path / f"node{r}.jsonl")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [o[1][-2000:] for o in outs]
    one = subprocess.run([*common, "--nnodes", "1", "--metrics", str(tmp_path / "one.jsonl")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    # rank 0 writes the metrics; c10d's rendezvous may give it to either node
    written = [p for p in (tmp_path / "node0.jsonl", tmp_path / "node1.jsonl") if p.exists() and p.read_text()]
    assert len(written) == 1
    two = [json.loads(line)["loss"] for line in written[0].read_text().splitlines()]
    single = [json.loads(line)["loss"] for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert len(single) == 4 and two == single

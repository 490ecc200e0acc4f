"""The reliability pieces one by one, in one process and without torch.distributed: how a failed
collective is named, which status a failed job ends with, manifests, the folder lock, metrics trimming,
and the non-finite stop."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autoplan.errors import SpecError
from runtime.torchrun import status_of
from runtime.train.guard import NonFiniteStop, check_step
from runtime.train.lock import DirectoryLock, check_free
from runtime.train.manifest import Manifest, check_files, complete_checkpoints, file_digest, manifest_text, read_manifest
from runtime.train.metrics_resume import trim_after
from runtime.train.watchdog import describe


def _fake_stack(message: str):
    """A traceback through files named like torch's pipelining schedule, c10d and our trainer."""
    namespace: dict = {}
    exec(compile("def recv():\n    raise RuntimeError(MESSAGE)\n",
                 "/x/site-packages/torch/distributed/distributed_c10d.py", "exec"), namespace)
    exec(compile("def _step_microbatches(action):\n    recv()\n",
                 "/x/site-packages/torch/distributed/pipelining/schedules.py", "exec"), namespace)
    exec(compile("def run(step):\n    _step_microbatches('1F3')\n", "/repo/runtime/trainer.py", "exec"), namespace)
    namespace["MESSAGE"] = message
    try:
        namespace["run"](6)
    except RuntimeError as err:
        return err


def test_a_timed_out_pipeline_action_is_named():
    err = _fake_stack("[/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation")
    line, status = describe(err, 5.0)
    assert status == 4
    assert line.startswith("step 7: pipeline action 1F3 recv (runtime/trainer.py:2 run) waited longer than "
                           "--timeout 5 s (Timed out waiting 5000ms for recv operation)"), line


def test_a_lost_peer_and_a_bug_are_told_apart():
    line, status = describe(_fake_stack("[pair.cc:534] Connection closed by peer [127.0.0.1]:4"), 300.0)
    assert status == 5 and "lost a peer rank" in line
    assert describe(_fake_stack("shape mismatch"), 300.0) is None  # a bug keeps its traceback
    assert describe(KeyError("x"), 300.0) is None


def test_a_lost_peer_wrapped_by_the_pipeline_stage_is_named():
    """torch's pipelining re-raises a failed backward collective as RuntimeError("Failed to run stage
    backward ...") from the gloo error: the peer is lost in the cause (issue 33: the surviving TP rank of a
    tp2 pp2 run printed a traceback)."""
    namespace: dict = {}
    exec(compile("def stage_backward(cause):\n    raise RuntimeError('\\n Failed to run stage backward:\\n "
                 "Stage output: ...') from cause\n",
                 "/x/site-packages/torch/distributed/pipelining/_backward.py", "exec"), namespace)
    cause = RuntimeError("[/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:60635: Connection reset by peer.")
    try:
        namespace["stage_backward"](cause)
    except RuntimeError as err:
        line, status = describe(err, 300.0)
    assert status == 5 and "lost a peer rank (Read error [127.0.0.1]:60635: Connection reset by peer.)" in line
    wrapped_bug = RuntimeError("Failed to run stage backward")
    wrapped_bug.__cause__ = ValueError("shape mismatch")
    assert describe(wrapped_bug, 300.0) is None


@pytest.mark.parametrize("codes, status", [
    ([-9, 5, 5], 137),      # a killed rank is the cause; its peers only lost it
    ([5, -15, -15], 5),     # SIGTERM is torchrun stopping the survivors: not a cause
    ([4, 5, -9], 4),        # a timeout explains the rest
    ([3, 3, 3, 3], 3),      # a deliberate stop
    ([1, 2], 2),            # bad input beats a crash it caused
    ([-15], 143),
])
def test_status_of_a_failed_job(codes, status):
    failures = {r: SimpleNamespace(exitcode=c, timestamp=r) for r, c in enumerate(codes)}
    assert status_of(failures) == status


def test_manifest_catches_changed_missing_and_resized_files(tmp_path):
    folder = tmp_path / "step_5"
    folder.mkdir()
    for name in ("a.distcp", "b.distcp", "rng_rank0.pt"):
        (folder / name).write_bytes(name.encode() * 1000)
    files = {p.name: file_digest(p) for p in folder.iterdir()}
    (folder / "COMPLETE").write_text(manifest_text(Manifest(5, "ab" * 32, {"tp": 1}, files)))
    manifest = read_manifest(folder)
    assert manifest.step == 5 and manifest.files == files
    names = sorted(files)
    assert check_files(folder, manifest, names) is None
    data = bytearray((folder / "b.distcp").read_bytes())
    data[10] ^= 1
    (folder / "b.distcp").write_bytes(bytes(data))
    assert "b.distcp does not match its SHA-256" in check_files(folder, manifest, names)
    (folder / "a.distcp").write_bytes(b"short")
    assert "a.distcp has 5 bytes, the manifest says 8000" in check_files(folder, manifest, names)
    (folder / "rng_rank0.pt").unlink()
    assert check_files(folder, manifest, ["rng_rank0.pt"]) == "rng_rank0.pt is missing"
    (tmp_path / "step_9.tmp").mkdir()
    (tmp_path / "step_7").mkdir()  # no marker
    (tmp_path / "step_x").mkdir()
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [5]
    (folder / "COMPLETE").write_text("5\n")  # written before manifests: used unverified
    assert read_manifest(folder) is None
    (folder / "COMPLETE").write_text("{not json")
    with pytest.raises(ValueError, match="not a checkpoint manifest"):
        read_manifest(folder)


def test_one_run_per_checkpoint_folder(tmp_path):
    first = DirectoryLock(tmp_path).acquire()
    with pytest.raises(SpecError, match=r"in use by pid \d+ on .* since"):
        DirectoryLock(tmp_path).acquire()  # a second open file: flock conflicts even in one process
    with pytest.raises(SpecError):
        check_free(tmp_path)
    first.release()
    check_free(tmp_path)
    DirectoryLock(tmp_path).acquire().release()


def test_resumed_metrics_keep_the_steps_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 14)]
    path.write_text("\n".join(rows) + '\n{"step": 14, "lo')  # the last line cut by the crash
    trim_after(str(path), 10)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == list(range(1, 11))
    trim_after(str(tmp_path / "missing.jsonl"), 3)
    assert not (tmp_path / "missing.jsonl").exists()


def test_non_finite_step_names_the_step_and_the_checkpoint(tmp_path):
    check_step(3, 2.5, 1.0, None)
    with pytest.raises(NonFiniteStop, match=r"stopped at step 9: the loss is nan .* the last good checkpoint is "
                                            r".*step_5"):
        check_step(9, float("nan"), 1.0, tmp_path / "step_5")
    with pytest.raises(NonFiniteStop, match="no checkpoint was written"):
        check_step(2, 1.0, float("inf"), None)
    # an fp16 step skipped for overflow (norm not checked) goes on; its loss must still be finite
    check_step(4, 2.5, None, None)
    with pytest.raises(NonFiniteStop):
        check_step(4, float("inf"), None, None)

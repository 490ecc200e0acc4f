"""The host-speed probes (runtime/train/speed_probe.py) and what a run's summary says of them."""

import torch

from runtime.train.metrics import MetricsLog
from runtime.train.speed_probe import probe, probe_between_steps


def test_summary_gives_the_host_speed_over_the_timed_steps(tmp_path):
    """Calibrated at (1000, 4) us, probed at (2000, 5) us over the timed steps: kernels ran at 0.50x, host
    work at 0.80x. The first step's probe is left out with its time."""
    log = MetricsLog(str(tmp_path / "m.jsonl"), 1.0, 0.1, calibrated_probes_us=(1000.0, 4.0))
    for step, (seconds, gemm, op) in enumerate([(9.0, 1.0, 1.0), (2.0, 2000.0, 5.0), (2.0, 2000.0, 5.0)], 1):
        row = log.record(step, 1.0, seconds, 512, 0.1, 1e-3, 1.0, speed_probe={"gemm_us": gemm, "op_us": op})
        assert row["speed_probe"] == {"gemm_us": gemm, "op_us": op}
    summary = log.summary()
    assert "predicted 1 s (error -50.0%)" in summary
    assert summary.endswith("host speed against its calibration: kernels 0.50x, host work 0.80x"), summary
    uncalibrated = MetricsLog(None, 1.0, 0.1)
    uncalibrated.record(1, 1.0, 2.0, 512, 0.1, 1e-3, 1.0, speed_probe={"gemm_us": 2000.0, "op_us": 5.0})
    assert "host speed" not in uncalibrated.summary()


def test_probes_time_a_gemm_and_an_eager_op_and_skip_accelerators():
    threads = torch.get_num_threads()
    p = probe(repeats=2)
    # a 384^3 GEMM (113 MFLOP) takes between 10 us (10 TFLOP/s) and 1 s; one eager add 0.1 us to 10 ms
    assert 10.0 < p["gemm_us"] < 1e6 and 0.1 < p["op_us"] < 1e4, p
    assert torch.get_num_threads() == threads  # the caller's thread count is restored
    assert probe_between_steps(torch.device("meta")) is None  # and no collective: no group exists here

"""The shipped device profiles: every GPU efficiency names its source, and each GEMM curve reproduces the
measured GEMMs kept beside it (so the curve is derived from them, not set by hand)."""

import pytest

from autoplan.cost.compute import gemm_efficiency
from autoplan.schema import load_device
from autoplan.schema.io import shipped_names

GPUS = [n for n in shipped_names("hardware") if load_device(n).kind == "gpu"]
EFFICIENCY_FIELDS = ("matmul_efficiency", "matmul_half_size_gflop", "memory_efficiency", "flash_fwd_efficiency",
                     "flash_bwd_efficiency", "flash_half_seq_len")


def test_the_new_devices_ship():
    assert {"a100-sxm-40gb", "h100-nvl-94gb", "h800-sxm-80gb", "b200-sxm-180gb"} <= set(GPUS)


@pytest.mark.parametrize("name", GPUS)
def test_every_efficiency_has_a_source(name):
    device = load_device(name)
    fields = EFFICIENCY_FIELDS + (("fp8_matmul_efficiency", "fp8_matmul_half_size_gflop")
                                  if device.peak_fp8_tflops else ())
    for field in fields:
        assert device.source_of(field), f"{name}: {field} has no source"


@pytest.mark.parametrize("name", [n for n in GPUS if load_device(n).matmul_points])
def test_gemm_curve_reproduces_its_measured_points(name):
    """Largest residual 8%, median 5% (the fits' residuals are stated in the sources)."""
    device = load_device(name)
    errors = []
    for p in device.matmul_points:
        flops = 2.0 * p.m * p.n * p.k
        predicted = gemm_efficiency(flops, device, p.dtype) * device.peak_tflops(p.dtype)
        errors.append(abs(predicted / p.tflops - 1))
    assert max(errors) < 0.08
    assert sorted(errors)[len(errors) // 2] < 0.05


@pytest.mark.parametrize("field, value", [("memory_bandwidth_gb_per_s", 1e-300), ("peak_fp32_tflops", 1e-300),
                                          ("matmul_efficiency", 1e-300)])
def test_a_device_slower_than_any_real_one_is_refused_naming_the_field(field, value):
    """A profile whose speeds make a step longer than 2^53 ns (a fuzzed 1e-300 GB/s) would make the search's
    integers and the simulation's floats round apart; it is refused at load, naming the field."""
    import dataclasses

    from autoplan.errors import SpecError
    from autoplan.schema._io import validated

    device = load_device("cpu")
    with pytest.raises(SpecError, match=f"{field}: .* must be at least"):
        validated(dataclasses.replace(device, **{field: value}))


def test_a_step_no_real_machine_would_take_is_one_line(tmp_path, capsys):
    """Speeds each within its field's range can still make a layer take longer than any table holds
    (1 kFLOP/s at 0.2% efficiency for a 1.3B model): refused in one line naming the cluster, exit 2."""
    import dataclasses

    from autoplan.cli.main import main
    from autoplan.schema import load_cluster
    from autoplan.schema._io import dump_yaml

    cluster = load_cluster("cpu-local")
    slow = dataclasses.replace(cluster.device, peak_fp32_tflops=1e-9, matmul_efficiency=0.002)
    path = tmp_path / "slow.yaml"
    path.write_text(dump_yaml(dataclasses.replace(cluster, device=slow)))
    assert main(["plan", "gpt3-1.3b", "--cluster", str(path), "--global-batch-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster: one layer's work would take" in err[0]

"""``autoplan profile``: writes a loadable profile; bad arguments are one-line errors with exit status 2."""

from __future__ import annotations

import sys

import pytest

from autoplan.cli.main import main
from autoplan.schema.profile import load_profile


def test_writes_profile(tmp_path, capsys):
    out = tmp_path / "gpt.yaml"
    assert main(["profile", "gpt-tiny", "-o", str(out), "--micro-batch-sizes", "1,2", "--tp-sizes", "1,2",
                 "--quiet"]) == 0
    profile = load_profile(out)
    assert profile.micro_batch_sizes == (1, 2) and profile.tp_sizes == (1, 2)
    assert "gpt-tiny: 420,480 params, 8 blocks" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["gpt-tiny", "--micro-batch-sizes", "1,x"], "--micro-batch-sizes: expected comma-separated"),
    (["gpt-tiny", "--dtype", "fp64"], "--dtype: 'fp64' is not one of"),
    (["gpt-tiny", "--device", "tpu"], "--device: 'tpu' is not one of"),
    (["no-such-model"], "no-such-model: no such file or shipped model"),
    (["nosuchpkg.mod:build"], "cannot import the factory"),
])
def test_bad_arguments(tmp_path, capsys, argv, message):
    assert main(["profile", *argv, "-o", str(tmp_path / "x.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_hf_config_without_transformers(tmp_path, capsys, monkeypatch):
    from tests.profiler.conftest import HF_LLAMA_CONFIG

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    assert main(["profile", HF_LLAMA_CONFIG, "-o", str(tmp_path / "x.yaml"), "--quiet"]) == 2
    assert "pip install 'autoplan[hf]'" in capsys.readouterr().err


def test_a_config_json_in_the_working_folder_takes_the_folder_name(tmp_path, monkeypatch):
    """`cd model_dir && autoplan profile config.json`: the profile is named after model_dir, not ''
    (issue 29: a profile named '' was then refused by `autoplan plan`)."""
    import shutil

    from tests.profiler.conftest import HF_LLAMA_CONFIG

    folder = tmp_path / "my-llama"
    folder.mkdir()
    shutil.copy(HF_LLAMA_CONFIG, folder / "config.json")
    monkeypatch.chdir(folder)
    assert main(["profile", "config.json", "-o", str(tmp_path / "p.yaml"), "--quiet", "--tp-sizes", "1"]) == 0
    assert load_profile(tmp_path / "p.yaml").name == "my-llama"

"""The profile YAML round-trips exactly, loads strictly without torch, and refuses bad documents."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from autoplan.errors import SpecError
from autoplan.schema._io import write_atomic
from autoplan.schema.profile import dump_profile, is_profile_file, load_profile


def test_round_trip(tmp_path, llama_profile):
    path = tmp_path / "p.yaml"
    write_atomic(path, dump_profile(llama_profile))
    assert load_profile(path) == llama_profile
    assert is_profile_file(path)


def test_loads_without_torch(tmp_path, gpt_profile):
    path = tmp_path / "p.yaml"
    write_atomic(path, dump_profile(gpt_profile))
    code = ("import sys; sys.modules['torch'] = None\n"
            "from autoplan.schema.profile import load_profile\n"
            f"p = load_profile({str(path)!r}); print(p.total_params)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == gpt_profile.total_params


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(extra=1), "extra: unknown key"),
    (lambda d: d.pop("layers"), "layers: missing required key"),
    (lambda d: d.update(total_params=d["total_params"] + 1), "total_params: must equal"),
    (lambda d: d["layers"][1]["measurements"].pop(), "layers[1].measurements"),
    (lambda d: d.update(dtype="fp8"), "dtype: 'fp8' is not allowed"),
])
def test_strict_load(tmp_path, gpt_profile, edit, message):
    data = yaml.safe_load(dump_profile(gpt_profile))
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile(path)

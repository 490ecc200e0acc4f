"""Profiles shared by the profiler tests: each is traced once per session (about a second each on meta)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.profiler.model_profile import ProfileOptions, profile_model

HERE = Path(__file__).parent
HF_LLAMA_CONFIG = str(HERE / "hf_llama_tiny" / "config.json")
MIXER = "examples.custom_model.mixer:build"
META = ProfileOptions(device="meta", micro_batch_sizes=(1, 2), tp_sizes=(1, 2, 4), progress=False)


@pytest.fixture(scope="session")
def gpt_profile():
    return profile_model("gpt-tiny", META)


@pytest.fixture(scope="session")
def llama_profile():
    return profile_model("llama-tiny", META)


@pytest.fixture(scope="session")
def hf_profile():
    pytest.importorskip("transformers")
    return profile_model(HF_LLAMA_CONFIG, META)


@pytest.fixture(scope="session")
def mixer_profile():
    return profile_model(MIXER, ProfileOptions(device="meta", micro_batch_sizes=(1, 2), tp_sizes=(1, 2),
                                               progress=False))

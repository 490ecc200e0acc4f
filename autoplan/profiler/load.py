"""Turning the MODEL argument of ``autoplan profile`` into a module and a way to make its inputs.

Three kinds of MODEL, tried in this order:

* ``package.module:factory`` -- a user callable returning ``(module, example_batch)``; the batch is a
  tensor, a tuple of positional tensors or a dict of keyword tensors, batch axis first. The profiler
  remakes it at each micro-batch size with the same per-sample shape and dtype.
* a path to a Hugging Face ``config.json`` -- built with ``AutoModelForCausalLM.from_config`` on meta
  (never downloaded; ``transformers`` is the optional ``hf`` extra).
* a shipped model name or a ModelSpec YAML -- built with the runtime's reference model
  (``runtime.models.build_model``), the same modules ``autoplan run`` trains.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan.errors import SpecError


@dataclass
class LoadedModel:
    name: str
    source: str
    model: nn.Module
    make_batch: Callable[[int, torch.device], Any]
    """micro-batch size, device -> the model's input (token ids of zeros, or the example's shape)."""
    seq_len: int | None


def load_model(arg: str, seq_len: int | None, dtype: torch.dtype) -> LoadedModel:
    """The model on the meta device in ``dtype`` (floating parameters only) and its input maker."""
    if ":" in arg and not Path(arg).exists():
        loaded = _from_factory(arg, dtype)
    elif arg.endswith(".json"):
        loaded = _from_hf_config(arg, seq_len)
    else:
        loaded = _from_spec(arg, seq_len)
    loaded.model.to(dtype).train()
    return loaded


def _tokens(seq_len: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda b, device: torch.zeros(b, seq_len, dtype=torch.long, device=device)


def _from_spec(arg: str, seq_len: int | None) -> LoadedModel:
    from autoplan.schema import load_model as load_spec
    from runtime.models import build_model

    spec = load_spec(arg)
    s = seq_len or spec.seq_len
    model = build_model(spec, device="meta", seq_len=s)
    return LoadedModel(spec.name, arg, model, _tokens(s), s)


def _from_hf_config(arg: str, seq_len: int | None) -> LoadedModel:
    path = Path(arg)
    if not path.is_file():
        raise SpecError(f"{arg}: no such file")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise SpecError(f"{arg}: profiling a Hugging Face config needs transformers; "
                        "install it with: pip install 'autoplan[hf]'") from None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SpecError(f"{arg}: not valid JSON (line {err.lineno})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise SpecError(f"{arg}: not a Hugging Face config (no model_type key)")
    try:
        config = AutoConfig.for_model(data.pop("model_type"), **data)
    except ValueError as err:
        raise SpecError(f"{arg}: not a Hugging Face config ({str(err).splitlines()[0]})") from None
    config.use_cache = False
    s = seq_len or min(getattr(config, "max_position_embeddings", 2048), 2048)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        raise SpecError(f"{arg}: {config.model_type} is not a decoder-only causal LM transformers can build "
                        f"({str(err).splitlines()[0][:120]})") from None
    # the folder's name for a config.json (its absolute path: `cd model_dir && autoplan profile config.json`)
    name = (path.resolve().parent.name if path.name == "config.json" else path.stem)[:200] or "model"
    return LoadedModel(name, arg, model, _hf_batch(s), s)


def _hf_batch(seq_len: int) -> Callable[[int, torch.device], dict]:
    def make(b: int, device: torch.device) -> dict:
        return {"input_ids": torch.zeros(b, seq_len, dtype=torch.long, device=device), "use_cache": False}
    return make


def _from_factory(arg: str, dtype: torch.dtype) -> LoadedModel:
    module_name, _, attr = arg.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise SpecError(f"{arg}: cannot import the factory ({err}); use package.module:function") from None
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise SpecError(f"{arg}: the factory must return (module, example_batch)")
    module, example = result
    module = module.to("meta")
    seq = _example_seq_len(example)
    return LoadedModel(attr if attr != "build" else module_name.rsplit(".", 1)[-1], arg, module,
                       _like(example, dtype), seq)


def _example_seq_len(example: Any) -> int | None:
    first = next(iter(example.values())) if isinstance(example, dict) else (
        example[0] if isinstance(example, tuple) else example)
    """Token ids [B, S] have a sequence axis; images and other float inputs do not claim one."""
    is_tokens = isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point()
    return first.shape[1] if is_tokens else None


def _like(example: Any, dtype: torch.dtype) -> Callable[[int, torch.device], Any]:
    """Remake the example batch at another batch size: zeros for integers, standard normal in the
    profile's dtype for floats."""
    def one(t: Any, b: int, device: torch.device) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = (b, *t.shape[1:])
        if t.is_floating_point():
            return torch.randn(shape, dtype=dtype, device=device)
        return torch.zeros(shape, dtype=t.dtype, device=device)

    def make(b: int, device: torch.device) -> Any:
        if isinstance(example, dict):
            return {k: one(v, b, device) for k, v in example.items()}
        if isinstance(example, tuple):
            return tuple(one(v, b, device) for v in example)
        return one(example, b, device)
    return make


"""Hugging Face checkpoints in and out: ``autoplan run --init-from DIR`` fills each rank's stage models
from a ``transformers`` model folder (each rank reading only the slices it holds), ``autoplan export-hf``
and ``--save-hf`` write a folder ``AutoModelForCausalLM.from_pretrained`` loads.

| file | job |
| --- | --- |
| ``names.py`` | (torch-free) runtime parameter name <-> Hugging Face tensor, per family; how a slice is taken |
| ``files.py`` | (torch-free) the folder's tensors from safetensors headers; the checks before any process starts |
| ``config.py`` | (torch-free) the ``config.json`` written for a ModelSpec |
| ``load.py`` | ``load_hf_weights``: each parameter's local box read from the safetensors files |
| ``export.py`` | a DCP checkpoint of ours -> ``config.json`` + ``model.safetensors`` (sharded above 5 GB) |

This package's ``__init__`` imports nothing, so the launcher's preflight imports the torch-free modules
without torch.
"""

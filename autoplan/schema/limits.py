"""Bounds on what a schema accepts: sizes no cluster has, and what a YAML file may hold.

Each bound is far beyond any real training run (so it never refuses a real input) and far below what
would overflow, hang or exhaust memory somewhere downstream (so a typo such as ``num_nodes: 1280000000``
is one clear error instead of a search that never ends). The comment says where each number comes from.
"""

from __future__ import annotations

# --- the hardware ---------------------------------------------------------------------------------
MAX_DEVICES = 2**20
"""1,048,576 devices: about 10x the largest published training clusters (~100k GPUs in 2024)."""
MAX_DEVICES_PER_NODE = 1024
"""A node is what one torchrun starts; the largest single NVLink domains hold 72-576 GPUs."""
MAX_NODES = MAX_DEVICES

# --- the model ------------------------------------------------------------------------------------
MAX_LAYERS = 10_000
"""The deepest published decoder-only LLMs have ~200 blocks."""
MAX_HIDDEN_SIZE = 2**20
"""Published hidden sizes stop at 2^14-2^15 (GPT-3 175B: 12,288; Llama 3 405B: 16,384)."""
MAX_VOCAB_SIZE = 2**24
"""16.7M tokens; published vocabularies stop at ~256k."""
MAX_PARAMS = 10**15
"""A quadrillion parameters, ~1000x the largest published dense models."""

# --- the training run -----------------------------------------------------------------------------
MAX_SEQ_LEN = 2**24
"""16.7M tokens per sequence; published long-context training stops at ~1-10M."""
MAX_BATCH_SIZE = 2**24
"""Sequences per optimizer step; published runs use at most a few thousand (~16M tokens per step)."""
MAX_STEPS = 10**9
"""Optimizer steps; published runs take 10^5-10^6."""
MAX_SEED = 2**32 - 1
"""numpy's and most frameworks' seed range; torch takes 64 bits but the data seed is scaled by ~2^20."""
MAX_LEARNING_RATE = 10.0
"""Adam-family learning rates are 1e-5..1e-2; SGD on tiny models sometimes uses ~1."""

# --- the files ------------------------------------------------------------------------------------
MAX_YAML_BYTES = 8 * 2**20
"""The largest file autoplan writes, a per-layer profile of a 405B model, is well under 1 MiB."""
MAX_YAML_DEPTH = 64
"""Nesting levels; a plan nests 4 deep. Deeper is a mistake or an attack (Python's recursion limit)."""
MAX_YAML_VALUES = 1_000_000
"""Values in a document once aliases are expanded (a 'billion laughs' file expands to 10^9)."""
MAX_TEXT_CHARS = 4096
"""Characters in one text field (names, sources, paths)."""

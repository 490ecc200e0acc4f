"""A plan's fingerprint: which run a metrics file belongs to.

``autoplan run`` writes it into every metrics row (``plan_fingerprint``, runtime/train/metrics.py) and
``autoplan compare`` refuses to set a plan against the metrics of a run of another plan. It covers what
defines the run being measured: the model, the layout (``LAYOUT_FIELDS``: the parallel degrees, schedule,
micro-batching, stages and their recomputation) and the training setup but its knobs (``KNOBS``: learning
rate, schedule, seed... which ``autoplan run`` may override and which cost nothing). It leaves out what only describes
the plan: the cost model's prediction (``predicted``), the search (``solver``), the stack it was priced for
(``stack``) and the cluster (the same layout re-planned on another cluster, or with a re-calibrated
profile, is the same run).

Torch-free: the runtime imports it, as it imports the other schemas.
"""

from __future__ import annotations

import hashlib
import json

from autoplan.schema._io import to_dict
from autoplan.schema.plan import ModulePlan, Plan
from autoplan.schema.training import KNOBS

FINGERPRINT_KEY = "plan_fingerprint"
"""The metrics rows' field holding it."""
FINGERPRINT_CHARS = 16
"""Hex digits kept of the sha256: 64 bits, far from any chance collision among one user's runs."""


def plan_fingerprint(plan: Plan | ModulePlan) -> str:
    """``FINGERPRINT_CHARS`` hex digits of the sha256 of the model (a user's module: its reference, under
    the key ``module``), layout and training setup (JSON, sorted keys)."""
    training = {k: v for k, v in to_dict(plan.training).items() if k not in KNOBS}  # lr, seed...: same cost
    what = {"module": to_dict(plan.module)} if isinstance(plan, ModulePlan) else {"model": to_dict(plan.model)}
    run = {**what, "layout": to_dict(plan.layout()), "training": training}
    text = json.dumps(run, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_CHARS]

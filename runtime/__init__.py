"""autoplan's runtime: trains a model exactly as an autoplan ``Plan`` says, on gloo (CPU) or NCCL (GPU).

Entry point: ``torchrun --nproc_per_node N -m runtime.launch plan.yaml``. The runtime reads only
``autoplan.schema`` (and ``autoplan.errors``); the planner never imports torch or this package.
"""

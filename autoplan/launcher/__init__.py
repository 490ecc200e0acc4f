"""``autoplan run``'s launcher: checks everything before a process starts (``preflight``), builds the
torchrun command lines (``commands``), and runs torchrun as a supervised process group that signals
reach and that restarts from the newest intact checkpoint (``supervise``).

Torch-free unless the plan is for GPUs (then ``preflight`` asks torch how many are visible); it reads
checkpoint manifests and locks through the runtime's torch-free modules (``runtime.train.manifest``,
``runtime.train.lock``).
"""

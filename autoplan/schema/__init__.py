"""Typed, frozen descriptions of everything autoplan reads and writes, with strict YAML round-trip.

This package imports neither torch nor the runtime: the runtime imports it, never the other way round.
"""

from autoplan.schema.cluster import Cluster, Link
from autoplan.schema.hardware import DeviceProfile, MatmulPoint, Precision
from autoplan.schema.model import ModelSpec
from autoplan.schema.parallel_dims import ParallelDims
from autoplan.schema.plan import (
    SCHEMA_VERSION, Layout, MemoryBreakdown, ParallelConfig, Plan, Predicted, RecomputeMode, ScheduleKind, SolverInfo, Stage,
    TimeBreakdown, check_fits,
)
from autoplan.schema.stack import DEFAULT_STACK, StackProfile
from autoplan.schema.training import TrainingSetup
from autoplan.schema.io import dump_plan, load_cluster, load_device, load_model, load_plan, load_stack, plan_to_dict

__all__ = [
    "SCHEMA_VERSION", "Cluster", "DeviceProfile", "Layout", "ParallelConfig", "Link", "MatmulPoint", "MemoryBreakdown", "ModelSpec",
    "ParallelDims", "Plan", "Precision", "Predicted", "RecomputeMode", "ScheduleKind", "SolverInfo", "Stage", "StackProfile",
    "TimeBreakdown", "TrainingSetup", "check_fits", "DEFAULT_STACK", "dump_plan", "load_cluster", "load_device",
    "load_model", "load_plan", "load_stack", "plan_to_dict",
]

"""Finding and loading the YAML documents: shipped names or file paths, with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autoplan.errors import SpecError
from autoplan.schema._io import dump_yaml, from_dict, load_yaml, read_yaml, to_dict
from autoplan.schema.cluster import Cluster
from autoplan.schema.hardware import DeviceProfile
from autoplan.schema.model import ModelSpec
from autoplan.schema.plan import (
    MODULE_PLAN_KEY_ORDER, PLAN_KEY_ORDER, ModulePlan, Plan, is_module_plan, module_plan_refusal,
)
from autoplan.schema.stack import StackProfile
from profiles import PROFILES_DIR


def shipped_names(kind: str) -> list[str]:
    """Names of the shipped profiles of one kind ("models", "hardware", "clusters", "stacks")."""
    return sorted(p.stem for p in (PROFILES_DIR / kind).glob("*.yaml"))


def resolve(kind: str, name_or_path: str | os.PathLike) -> Path:
    """A shipped name (``llama3-8b``) or a path to a YAML file, as a path that exists."""
    text = str(name_or_path)
    shipped = PROFILES_DIR / kind / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    path = Path(text)
    if text and (path.exists() or path.is_symlink()):
        return path  # read_yaml says precisely what is wrong with it (a folder, a device, not UTF-8, ...)
    names = ", ".join(shipped_names(kind))
    raise SpecError(f"{text}: no such file or shipped {kind[:-1] if kind != 'hardware' else 'device'} "
                    f"(shipped: {names})")


def load_model(name_or_path: str | os.PathLike) -> ModelSpec:
    return load_yaml(ModelSpec, resolve("models", name_or_path))


def load_device(name_or_path: str | os.PathLike) -> DeviceProfile:
    return load_yaml(DeviceProfile, resolve("hardware", name_or_path))


def load_stack(name_or_path: str | os.PathLike) -> StackProfile:
    return load_yaml(StackProfile, resolve("stacks", name_or_path))


def load_cluster(name_or_path: str | os.PathLike) -> Cluster:
    """A cluster file names its device by shipped name or path; the loaded cluster embeds the profile."""
    path = resolve("clusters", name_or_path)
    data = read_yaml(path)
    if isinstance(data, dict) and isinstance(data.get("device"), str):
        try:
            device_path = resolve("hardware", data["device"])
        except SpecError as err:
            raise SpecError(f"{path}: device: {err}") from None
        data = {**data, "device": to_dict(load_device(device_path))}
    try:
        return from_dict(Cluster, data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain data, in reading order: the choices first, the embedded inputs last."""
    data = to_dict(plan)
    return {key: data[key] for key in PLAN_KEY_ORDER if key in data}


def dump_plan(plan: Plan) -> str:
    header = (f"# autoplan plan for {plan.model.name} on {plan.cluster.name} "
              f"({plan.cluster.num_nodes} x {plan.cluster.devices_per_node} {plan.cluster.device.name})\n"
              "# Run it with: autoplan run <this file>   (or torchrun ... -m runtime.launch <this file>)\n")
    return dump_yaml(plan_to_dict(plan), header)


def load_plan(path: str | os.PathLike, command: str = "this command") -> Plan:
    """A plan of a model the runtime builds; a plan for a user's own module is refused in one line."""
    data = read_yaml(path)
    if is_module_plan(data):
        raise SpecError(module_plan_refusal(path, command))
    try:
        return from_dict(Plan, data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


def load_any_plan(path: str | os.PathLike) -> Plan | ModulePlan:
    """A ``Plan`` or, for a user's own module, a ``ModulePlan`` (what ``autoplan run`` accepts)."""
    data = read_yaml(path)
    try:
        return from_dict(ModulePlan if is_module_plan(data) else Plan, data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


def dump_module_plan(plan: ModulePlan) -> str:
    """A plan for a user's own module as YAML, keys in the order a reader expects, with a header saying how to
    run it."""
    data = to_dict(plan)
    header = (f"# autoplan plan for your module {plan.module.name} ({plan.module.factory}) on {plan.cluster.name} "
              f"({plan.cluster.num_nodes} x {plan.cluster.devices_per_node} {plan.cluster.device.name})\n"
              "# Run it with: autoplan run <this file>   (the factory's module must be importable there)\n")
    return dump_yaml({key: data[key] for key in MODULE_PLAN_KEY_ORDER if key in data}, header)


__all__ = ["dump_module_plan", "dump_plan", "dump_yaml", "load_any_plan", "load_cluster", "load_device", "load_model",
           "load_plan", "load_stack", "plan_to_dict", "resolve", "shipped_names"]

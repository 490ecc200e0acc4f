"""A factory without ``autoplan_adapter``: profiled fine, refused by the runtime."""

from module_factories import build  # noqa: F401

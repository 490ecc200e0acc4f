"""The hardware, cluster and model YAML that ship with autoplan (a package only so that it installs)."""

from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parent

"""Moved to :mod:`spectrace.tracer.checkpoint`; this name stays only until ``cli/main.py``
imports ``from ..checkpoint import inspect_draft`` (then delete this file)."""

from .checkpoint import LEVELS, SCHEMA, Report, Verdict, inspect_draft

__all__ = ["LEVELS", "SCHEMA", "Report", "Verdict", "inspect_draft"]

"""What every spec class shares: rebuilding from a manifest's dict, the variable-shape error."""

from __future__ import annotations

import dataclasses


class VariableShapeError(ValueError):
    """A fixed image shape was asked of a dataset whose images differ in size."""


def spec_from_fields(cls, data: dict):
    """A frozen spec dataclass ``cls`` from its ``to_dict()``, refusing unknown fields by
    name (a manifest written by another version says so, rather than a TypeError)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**data)

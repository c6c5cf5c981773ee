"""Counting reports that add up field by field (one materializer pass + the next, ...)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Self


class Summable:
    """Mixin for a dataclass whose fields are all counts: ``a + b`` adds each field."""

    def __add__(self, other: Self) -> Self:
        values: dict[str, Any] = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)  # type: ignore[arg-type]
        }
        return type(self)(**values)

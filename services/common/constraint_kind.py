"""The kinds of output constraint, shared by the frontend (which builds them) and the scheduler
(which compiles them). Mirrors scheduler.proto `ConstraintType`, with the same numbers."""
from __future__ import annotations

import enum


class ConstraintKind(enum.IntEnum):
    STRUCTURAL_TAG = 1
    JSON_SCHEMA = 2
    JSON_OBJECT = 3

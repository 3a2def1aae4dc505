"""Saved training states (`train-demo`, `train-demo-draft`, `tune-demo-mtp`): written atomically,
so an interrupted save leaves the previous state; read back only under the settings that wrote
them."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch


def write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    torch.save(state, staging)
    os.replace(staging, path)


def read_state(path: Path, settings: dict) -> Optional[dict]:
    """The state saved at `path` (None if there is none); refused if other settings wrote it."""
    if not path.is_file():
        return None
    saved = torch.load(path, weights_only=False)
    if saved["settings"] != settings:
        raise ValueError(f"{path} was written with other settings: {saved['settings']}")
    return saved

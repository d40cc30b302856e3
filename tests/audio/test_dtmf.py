"""Keypad tones (in-band DTMF): tones made here as sine pairs at the ITU-T Q.23 frequencies, at Q.24's edge
timings, through G.711 and noise, are found where they were put and silenced; blips, other telephony tones and
real speech and hold music are not taken for keys (talk-off). Expected times are written from how each signal
is built (the lead-in, the tone and pause lengths), never taken from the detector."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.audio.dtmf import KeypadDetector, ToneSpan, detect_tones, silence_tones
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from tests.audio.conftest import KEYS, LEAD_MS, LEVEL_DB, RATE, _ms, dialled, key_tone

TOLERANCE_MS = 3  # a measured edge against where the tone was put
ASTERISK = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
HOLD_MUSIC = Path("/usr/share/asterisk/moh")
SAMPLE_CALLS = Path(__file__).resolve().parents[2] / "samples" / "calls"


def through(samples: np.ndarray, encoding: str) -> np.ndarray:
    """The samples as a leg carries them: encoded and decoded again (pcm16: rounded to 16 bits)."""
    return codecs.decode(codecs.encode(samples, encoding), encoding)


def found_as_put(found: list[ToneSpan], put: list[tuple[int, int]]) -> bool:
    return len(found) == len(put) and all(
        abs(f.start_ms - a) <= TOLERANCE_MS and abs(f.end_ms - b) <= TOLERANCE_MS for f, (a, b) in zip(found, put, strict=False))


# ---- Q.23 frequencies, Q.24 timings, G.711 --------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["pcm16", "mulaw", "alaw"])
def test_every_key_40_ms_with_40_ms_pauses_is_found_where_it_was(encoding: str) -> None:
    """Q.24's shortest tone and shortest pause: all 16 keys, each found once, its edges within 3 ms."""
    samples, put = dialled(KEYS, 40, 40)
    assert put[0] == (200, 240) and put[-1] == (1400, 1440)  # 16 keys, one every 80 ms
    assert found_as_put(detect_tones(through(samples, encoding)), put)


@pytest.mark.parametrize("encoding", ["pcm16", "mulaw", "alaw"])
@pytest.mark.parametrize("on_ms", [20, 25, 30])
def test_blips_of_30_ms_and_shorter_are_not_keys(encoding: str, on_ms: int) -> None:
    samples, _ = dialled(KEYS, on_ms, 40)
    assert detect_tones(through(samples, encoding)) == []


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
@pytest.mark.parametrize("condition", [
    {"snr_db": 20}, {"snr_db": 10}, {"level_db": -35.0}, {"twist_db": 4.0}, {"twist_db": -8.0},
    {"off": 0.015}, {"off": -0.015},
], ids=["noise-20dB", "noise-10dB", "level-35dBFS", "twist+4dB", "twist-8dB", "freq+1.5%", "freq-1.5%"])
def test_keys_within_q24_limits_are_found_through_g711(encoding: str, condition: dict[str, float]) -> None:
    """White noise (its power this far below one sine's), a quiet line, Q.24's twist limits (column 4 dB
    above the row, 8 dB below) and keys 1.5 % off their frequencies: every key found, where it was."""
    tone = {k: v for k, v in condition.items() if k != "snr_db"}
    samples, put = dialled(KEYS, 40, 40, **tone)
    if "snr_db" in condition:
        sine_power = 10 ** (LEVEL_DB / 10) / 2
        noise = np.random.default_rng(1).normal(0, np.sqrt(sine_power / 10 ** (condition["snr_db"] / 10)), samples.size)
        samples = samples + noise.astype(np.float32)
    assert found_as_put(detect_tones(through(samples, encoding)), put)


def test_a_pause_of_40_ms_parts_two_presses_of_one_key_and_an_interruption_of_10_ms_does_not() -> None:
    press = key_tone("5", 60)
    gap, pad = np.zeros(_ms(40), np.float32), np.zeros(_ms(LEAD_MS), np.float32)
    parted = detect_tones(through(np.concatenate([pad, press, gap, press, pad]), "mulaw"))
    assert found_as_put(parted, [(200, 260), (300, 360)])
    dropout = np.zeros(_ms(10), np.float32)
    joined = detect_tones(through(np.concatenate([pad, press, dropout, press, pad]), "mulaw"))
    assert found_as_put(joined, [(200, 330)])


def test_a_key_held_for_seconds_is_one_tone() -> None:
    samples = np.concatenate([np.zeros(_ms(LEAD_MS), np.float32), key_tone("0", 2500), np.zeros(_ms(LEAD_MS), np.float32)])
    assert found_as_put(detect_tones(through(samples, "alaw")), [(200, 2700)])


def test_other_sounds_with_two_frequencies_are_not_keys() -> None:
    """Dial, busy and ringback tones (350+440, 480+620, 440+480 Hz), one key frequency alone, a key 5 % off,
    twisted 10 dB, with a second harmonic 6 dB under each sine, or below -40 dBFS: none is a key."""
    t = np.arange(_ms(300)) / RATE

    def pair(low: float, high: float, a: float = 0.3, b: float = 0.3) -> np.ndarray:
        return a * np.sin(2 * np.pi * low * t) + b * np.sin(2 * np.pi * high * t)

    sounds = {
        "dial tone": pair(350, 440), "busy": pair(480, 620), "ringback": pair(440, 480),
        "697 Hz alone": pair(697, 1209, b=0.0), "5 % off": pair(697 * 1.05, 1209 * 1.05),
        "column 10 dB up": pair(770, 1336, a=0.3 * 10 ** (-10 / 20)),
        "harmonics": pair(852, 1477) + pair(2 * 852, 2 * 1477, 0.15, 0.15),
        "quiet": pair(941, 1633, 10 ** (-45 / 20), 10 ** (-45 / 20)),
    }
    pad = np.zeros(_ms(LEAD_MS))
    found = {name: detect_tones(through(np.concatenate([pad, x, pad]), "mulaw")) for name, x in sounds.items()}
    assert found == {name: [] for name in sounds}


def test_a_16_khz_leg_is_measured_at_its_own_rate() -> None:
    samples = np.concatenate([np.zeros(3200, np.float32), key_tone("8", 50, rate=16000), np.zeros(3200, np.float32)])
    assert found_as_put(detect_tones(through(samples, "pcm16"), 16000), [(200, 250)])


# ---- what is kept: times, never keys; silenced samples -----------------------------------------------------

def test_a_tone_s_record_is_its_time_and_nothing_else() -> None:
    assert [f.name for f in dataclasses.fields(ToneSpan)] == ["start_ms", "end_ms"]
    samples, _ = dialled("4111", 60, 60)
    assert not any(hasattr(span, "key") or hasattr(span, "digit") for span in detect_tones(samples))


def test_the_stream_lets_every_sample_out_once_in_order_with_the_tones_silenced() -> None:
    """Any chunking gives the same samples out: the input's, but zero over each tone and 10 ms either side."""
    samples, put = dialled("4111111111111111", 70, 50)
    samples = through(samples + np.random.default_rng(2).normal(0, 0.003, samples.size).astype(np.float32), "mulaw")
    outputs = []
    for chunk in (1, 37, 160, 1600, samples.size):
        detector = KeypadDetector(RATE)
        out = [detector.process(samples[i:i + chunk]) for i in range(0, samples.size, chunk)] + [detector.flush()]
        outputs.append(np.concatenate(out))
        assert found_as_put(detector.spans, put)
    assert all(np.array_equal(o, outputs[0]) for o in outputs[1:]) and outputs[0].size == samples.size
    silent = np.zeros(samples.size, bool)
    for a, b in put:  # each tone, 10 ms either side, within the edge tolerance
        silent[_ms(a - 10 + TOLERANCE_MS): _ms(b + 10 - TOLERANCE_MS)] = True
    assert not outputs[0][silent].any()
    kept = np.ones(samples.size, bool)
    for a, b in put:
        kept[_ms(a - 10 - TOLERANCE_MS): _ms(b + 10 + TOLERANCE_MS)] = False
    np.testing.assert_array_equal(outputs[0][kept], samples[kept])


def test_silence_tones_silences_a_recording_as_the_stream_does() -> None:
    samples, put = dialled("12", 50, 100)
    quiet = silence_tones(samples, RATE, [ToneSpan(a, b) for a, b in put])
    assert not quiet[_ms(190): _ms(260)].any() and not quiet[_ms(340): _ms(410)].any()
    assert detect_tones(quiet) == []


def test_a_restored_detector_goes_on_as_the_uninterrupted_one() -> None:
    """Snapshots anywhere, a tone under way included, and a gap skipped: the same samples and tones."""
    samples, put = dialled("90#", 300, 45)
    reference = KeypadDetector(RATE)
    whole = np.concatenate([reference.process(samples), reference.flush()])
    assert found_as_put(reference.spans, put)
    under_way = 0
    for at in range(0, samples.size, 211):
        first = KeypadDetector(RATE)
        before = first.process(samples[:at])
        snap = first.snapshot()
        under_way += snap.rescan < snap.released + snap.audio.size - 205
        again = KeypadDetector.restored(RATE, snap)
        assert np.array_equal(np.concatenate([before, again.process(samples[at:]), again.flush()]), whole), at
        assert again.spans == reference.spans, at
    assert under_way > 0


def test_a_gap_skipped_by_its_length_moves_the_clock_on() -> None:
    """A hold's digital silence is not passed through (``skip``): what was held comes out first, and the tones
    after it are timed on the leg's clock, the gap included."""
    pad = np.zeros(_ms(LEAD_MS), np.float32)
    before, after = np.concatenate([pad, key_tone("1", 60), pad]), np.concatenate([key_tone("2", 60), pad])
    detector = KeypadDetector(RATE)
    out = [detector.process(before), detector.skip(_ms(1000)), detector.process(after), detector.flush()]
    assert sum(o.size for o in out) == before.size + after.size  # the gap is counted, not let out
    assert found_as_put(detector.spans, [(200, 260), (1460, 1520)])  # 460 ms, then 1 s of gap


# ---- talk-off and talk-down ---------------------------------------------------------------------------------

def _legs_8k(paths: list[Path]) -> list[tuple[str, np.ndarray]]:
    legs = []
    for path in paths:
        audio = load_audio(path)
        for channel in range(audio.channels):
            x = audio.samples[channel]
            legs.append((f"{path.name}[{channel}]", x if audio.sample_rate == RATE else resample(x, audio.sample_rate, RATE)))
    return legs


def test_no_key_is_heard_in_real_speech_or_hold_music(speech_recordings_16k: dict[str, np.ndarray]) -> None:
    """Talk-off: the Debian speech recordings (pocketsphinx, ALSA), every Asterisk prompt, the sample calls'
    legs and the hold-music tracks, as a leg carries them (8 kHz mu-law): no tone at all."""
    legs = [(name, resample(x, 16000, RATE)) for name, x in speech_recordings_16k.items()]
    legs += _legs_8k(sorted(ASTERISK.rglob("*.wav")) + sorted(SAMPLE_CALLS.glob("*.wav")) + sorted(HOLD_MUSIC.glob("*.wav")))
    seconds = sum(x.size for _, x in legs) / RATE
    assert seconds > 2500  # about 45 minutes of speech and music
    talk_off = {name: spans for name, x in legs if (spans := detect_tones(through(x, "mulaw")))}
    assert talk_off == {}


def test_keys_typed_under_speech_are_found_and_the_speech_kept(goforward_raw: Path) -> None:
    """Talk-down: a card number typed while someone talks 10 dB under the tones: every key found, the
    speech between the tones let through as it was."""
    speech = resample(load_audio(goforward_raw).mono(), 16000, RATE)
    samples, put = dialled("4111111111111111", 80, 80)
    loud = np.abs(speech) > 0.01
    speech = speech / np.sqrt(np.mean(speech[loud] ** 2)) * 10 ** ((LEVEL_DB - 10) / 20)  # 10 dB under a sine's peak
    speech = np.resize(speech, samples.size)
    mixed = through(samples + speech, "mulaw")
    detector = KeypadDetector(RATE)
    out = np.concatenate([detector.process(mixed), detector.flush()])
    assert found_as_put(detector.spans, put)
    between = np.zeros(samples.size, bool)
    for (_, end), (start, _) in zip(put, put[1:], strict=False):
        between[_ms(end + 10 + TOLERANCE_MS): _ms(start - 10 - TOLERANCE_MS)] = True
    np.testing.assert_array_equal(out[between], mixed[between])

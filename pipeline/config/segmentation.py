"""Settings of voice-activity detection and segmentation.

Defaults were chosen from measurements on the evaluation recordings and the two-leg sample calls
(see pipeline/segmentation/README.md).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class SegmentationSettings(BaseModel):
    # 400 rather than 500: the same WER (library-legs 5.3 %, eval 4.3 %, asterisk 8.5 against 8.6 %,
    # 8 kHz mu-law), 2 % more segments, and each segment closed 100 ms sooner (bench live at 6 calls: P50 0.65 against
    # 0.86 s, P99 1.19 against 1.53 s); 300 split 25 % more segments and cost eval one word
    # (bench/results/scheduling/, pipeline/bench/README.md).
    endpoint_silence_ms: int = Field(400, description="Trailing silence that closes a speech segment (ms).")
    vad_model_path: str = Field(
        "", description="Silero VAD ONNX file; empty means the one shipped in the silero-vad package."
    )
    # At 8000, an 8 kHz leg's VAD scores the leg's decoded samples (Silero's 8 kHz mode: 256-sample windows + 32 of
    # context, the same 32 ms grid), and only the pre-roll and the open segment are upsampled (bit for bit what the whole
    # leg upsampled gives). Library legs, 8 kHz mu-law, 32 legs batched in 20 ms frames: front end 2.14 -> 1.53 ms CPU
    # per audio s (VAD ONNX -43 %; the resampler runs on 45 % of the frames); 0.9 % of window decisions differ, 401
    # segments against 414 (fewer long-turn splits). bench accuracy (Moonshine base, 8 kHz mu-law, one run):
    # library-legs WER 3.8 % against 4.0 % at 16000, eval 5.1 % both. Not the default: Silero at 8 kHz finds onsets
    # later (of 385 library turns, 6 keep under 100 ms before their speech and one is clipped by 124 ms; at 16 kHz all
    # keep >= 100 ms), and the running pipeline's library test (7 calls, 1,152 words) went 7.8 -> 8.7 % WER, over its
    # 8 % gate (pipeline/segmentation/README.md).
    vad_sample_rate: int = Field(
        16000,
        description="Rate the VAD scores an 8 kHz leg at: 8000 (its own samples; only the pre-roll and the open "
        "segment are upsampled to 16 kHz) or 16000 (the whole leg upsampled first). Legs at other rates: 16000.",
    )
    vad_threshold: float = Field(0.5, description="VAD speech probability at or above which speech starts.")
    vad_neg_threshold: float = Field(
        0.35, description="VAD probability below which an open segment counts silence (hysteresis)."
    )
    min_speech_ms: int = Field(
        250, description="Segments with less speech than this (ms) are dropped as clicks and noise."
    )
    pre_roll_ms: int = Field(300, description="Audio kept before the detected speech onset (ms).")
    # The recogniser clipped or misheard first words with only the 300 ms pre-roll (Moonshine base), and a
    # longer pre-roll moved segment starts, which the talk-over and silence metrics read. The lead is heard, not
    # timed. bench accuracy, 8 kHz mu-law, one run (bench/results/asr-lead): library legs WER 4.0 -> 3.6 %, digit
    # sequences 17 -> 20 of 41; asterisk 5.5 and eval 5.1 % unchanged; library-numbers (number spans cut from their
    # turns with a margin) 25.7 -> 31.0 % (one 16-digit card read short). The running pipeline's library test (7 calls,
    # 1,152 words): 7.8 % -> 6.6 (100 ms), 5.6 (200), 6.8 (300). With VAD at 8 kHz: 8.7 -> 6.5 % (200).
    asr_lead_ms: int = Field(
        200, ge=0,
        description="Audio before a segment's pre-roll that the recogniser hears too, not counted in the segment's "
        "times (ms); it never reaches into the leg's previous segment.",
    )
    post_roll_ms: int = Field(150, description="Audio kept after the last speech window of a segment (ms).")
    max_segment_ms: int = Field(
        15000, description="Longest segment (ms); a longer one is cut at its quietest point."
    )
    # At 0, a long turn is decoded whole after its end (a 10-13 s turn alone took the P99 final at 6-10 calls
    # on 2 cores). Past long_segment_ms a shorter pause ends the segment, so a long turn is transcribed in
    # stretches while it goes on and its final decodes only the last one. bench live, 12 calls on 2 pinned cores, one
    # run (bench/results/long-turns): P99 final 1.91 -> 1.52 s (4000: 1.59), P50 0.83 -> 0.66 s, worker CPU per speech s
    # 0.94x; 24 of 386 turns split. bench accuracy (8 kHz mu-law, Moonshine base): library-legs WER 4.2 -> 4.0 %
    # (4000: 4.0, 8000: 4.1), eval 5.1 % unchanged, digits unchanged.
    long_segment_ms: int = Field(
        6000, ge=0,
        description="Speech (ms) after which a segment closes on long_segment_endpoint_ms of silence instead of "
        "endpoint_silence_ms; 0: never.",
    )
    long_segment_endpoint_ms: int = Field(
        200, ge=0,
        description="Trailing silence that closes a segment longer than long_segment_ms (ms); below post_roll_ms the "
        "segment's audio ends where the silence is cut short.",
    )
    # A hold sends no frames: its gap, filled with digital silence, could be 20 minutes of samples.
    # Past this much digital silence the VAD is reset and the rest is skipped, not scored (the leg's
    # clock still moves: later segments keep their call time). 2000 ms is 5x the endpoint silence
    # (400 ms, plus one VAD window to decay after speech): a segment open when the silence starts has
    # closed as silence closes it long before. Shorter runs, e.g. network gaps, are scored as before.
    gap_boundary_ms: int = Field(
        2000, ge=0,
        description="Digital silence (a gap in a leg's frames, or zero samples) after which the VAD is "
                    "reset and the rest skipped (ms); 0: never.",
    )

    # Callers type card numbers and PINs on the keypad while the agent listens; the tones are in the
    # audio. Silenced before the VAD, they never reach a segment, a transcript or the kept recording; only when
    # each tone was is kept (pipeline/audio/dtmf.py). Off: the tones go through as any other sound.
    keypad_tones: bool = Field(
        False,
        description="Find in-band keypad tones (DTMF) in each leg and silence them before the VAD and the "
        "recogniser; the call keeps how many and when, never which keys. Off by default for now: the "
        "detector costs about 9-18 ms of CPU per leg per audio-second at 20 ms messages, and with it on a "
        "2-core make test ran its timing-bound worker tests late; recordings still cut any tone they find.",
    )

    @field_validator("vad_sample_rate")
    @classmethod
    def _vad_rate(cls, value: int) -> int:
        if value not in (8000, 16000):
            raise ValueError("vad_sample_rate is 8000 or 16000")
        return value

"""Where the speech of a single-utterance recording starts and ends, by frame energy.

Used to place recordings in the sample calls and to score segmentation against something that does
not come from the VAD being scored. A 20 ms frame counts as speech when it is within 22 dB of the
recording's loudest frame: the noise floors of the evaluation recordings sit 30-45 dB below their peaks.
"""

from __future__ import annotations

import numpy as np

FRAME_MS = 20
BELOW_PEAK_DB = 22.0


def speech_span_ms(audio: np.ndarray, sample_rate: int, below_peak_db: float = BELOW_PEAK_DB) -> tuple[int, int]:
    """(start_ms, end_ms) from the first to the last frame within ``below_peak_db`` of the loudest."""
    frame = FRAME_MS * sample_rate // 1000
    frames = np.asarray(audio, dtype=np.float64)[: audio.size // frame * frame].reshape(-1, frame)
    if frames.size == 0:
        raise ValueError("audio shorter than one 20 ms frame")
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (-below_peak_db / 20))
    return int(loud[0]) * FRAME_MS, (int(loud[-1]) + 1) * FRAME_MS

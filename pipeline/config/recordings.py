"""Settings of the redacted recordings: each finished call's legs kept as stereo Ogg/Opus
(agent left, customer right) with every span its transcript redacts cut to silence.

The worker that finishes a call writes its job to ``topic_postcall`` (config/postcall.py); the job's
recording is written by whichever worker takes the job (pipeline/recordings). Retention of recordings is
``retention_days_audio`` (config/store.py).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class RecordingSettings(BaseModel):
    # On by default: supervisors listen as much as they read. Off keeps no audio at rest at all (the AWS
    # solutions' users ask for "a switch to keep no recordings"). CALLQA_RECORDINGS, default true.
    recordings: bool = Field(True, description="Keep each finished call's redacted recording.")
    # A local folder, or any URL fsspec opens (s3://bucket/prefix, gs://..., memory://): object stores need
    # their fsspec package (s3fs, gcsfs) installed. CALLQA_RECORDINGS_URL, default <state_dir>/recordings.
    recordings_url: str = Field(
        "", description="Where recordings are kept: a folder or an fsspec URL; empty: <state_dir>/recordings.",
    )
    # libsndfile's Opus compression level (it sets the bitrate). At 1.0, its lowest, Opus folds the two channels
    # into one and each leg holds the other's speech too (crosstalk 0 dB); 0.99 keeps them apart (-33 to -47 dB)
    # at about 16 kbit/s, 122 kB a minute of call (`callqa bench recordings` measures both, and 0.95).
    # CALLQA_RECORDINGS_COMPRESSION, default 0.99.
    recordings_compression: float = Field(
        0.99, ge=0, le=1, description="Opus compression level of recordings (0: largest, 1: smallest; 1 mixes the legs).",
    )
    # The transcript places a redacted span in its segment by its share of the characters; the cut starts
    # this much wider on each side, and is checked: the cut audio is decoded again and widened (to the whole
    # segment at last) while any of it still decodes to PII or to digits the redacted text did not keep.
    recordings_cut_margin_ms: int = Field(
        300, ge=0, description="A redacted span's cut reaches this far beyond its estimated times (ms).",
    )

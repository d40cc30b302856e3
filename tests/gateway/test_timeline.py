"""A leg's audio cut into 20 ms frames on the call's clock: gaps, overlaps, pauses, the last frame."""

from __future__ import annotations

import tracemalloc

from pipeline.gateway.timeline import FRAME_SAMPLES, MAX_FILLED_GAP_SAMPLES, MULAW_SILENCE, LegTimeline


def audio(n: int, value: int = 7) -> bytes:
    return bytes([value]) * n


def test_contiguous_audio_becomes_whole_frames_numbered_from_zero() -> None:
    timeline = LegTimeline()
    frames = timeline.write(0, audio(100)) + timeline.write(100, audio(300))
    assert [f.seq for f in frames] == [0, 1]
    assert all(len(f.payload) == FRAME_SAMPLES for f in frames)
    assert timeline.position == 400


def test_a_gap_in_the_stream_is_filled_with_silence_frames() -> None:
    timeline = LegTimeline()
    frames = timeline.write(0, audio(160)) + timeline.write(480, audio(160, 9))
    assert [f.seq for f in frames] == [0, 1, 2, 3]
    assert frames[1].payload == frames[2].payload == bytes([MULAW_SILENCE]) * 160
    assert frames[3].payload == audio(160, 9)
    assert timeline.counts.silence_samples == 320


def test_a_timestamp_a_day_ahead_costs_no_memory_its_gap_is_a_pause() -> None:
    """One message whose timestamp lies a day ahead (a bad or hostile sender) allocated the day's silence;
    a gap beyond MAX_FILLED_GAP_SAMPLES is skipped like a pause: no frames for it, the seq jumps."""
    timeline = LegTimeline()
    frames = timeline.write(0, audio(160))
    day = 86_400 * 8000
    tracemalloc.start()
    frames += timeline.write(day, audio(160, 9))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # the day's silence would be 691 MB
    assert [f.seq for f in frames] == [0, day // FRAME_SAMPLES]
    assert frames[1].payload == audio(160, 9) and timeline.position == day + 160
    assert timeline.counts.skipped_samples == day - 160 and timeline.counts.silence_samples == 0
    # A gap up to the bound is still filled, frame by frame.
    filled = LegTimeline()
    frames = filled.write(0, audio(160)) + filled.write(160 + MAX_FILLED_GAP_SAMPLES, audio(160))
    assert len(frames) == 2 + MAX_FILLED_GAP_SAMPLES // FRAME_SAMPLES


def test_jitter_of_less_than_half_a_frame_continues_the_stream() -> None:
    timeline = LegTimeline()
    frames = timeline.write(0, audio(160)) + timeline.write(168, audio(160)) + timeline.write(310, audio(160))
    assert [f.seq for f in frames] == [0, 1, 2]
    assert timeline.counts.silence_samples == 0


def test_audio_for_a_time_already_written_is_dropped() -> None:
    timeline = LegTimeline()
    frames = timeline.write(0, audio(320)) + timeline.write(0, audio(480, 9))
    assert [f.seq for f in frames] == [0, 1, 2]
    assert frames[2].payload == audio(160, 9)
    assert timeline.counts.overlap_samples == 320


def test_a_pause_sends_no_frames_and_moves_the_seq_on() -> None:
    timeline = LegTimeline()
    frames = timeline.write(0, audio(200))  # frame 0 whole, frame 1 begun (40 samples)
    frames += timeline.skip(8000)  # 1 s paused
    frames += timeline.append(audio(400, 9))
    seqs = [f.seq for f in frames]
    # frame 1 is completed with silence and sent; the pause's 50 frames are not; audio resumes at
    # sample 8200, i.e. inside frame 51, which begins with silence up to it
    assert seqs == [0, 1, 51, 52]
    assert frames[1].payload == audio(40) + bytes([MULAW_SILENCE]) * 120
    assert frames[2].payload == bytes([MULAW_SILENCE]) * 40 + audio(120, 9)
    assert timeline.position == 8600


def test_the_last_frame_is_sent_short_as_replay_sends_it() -> None:
    timeline = LegTimeline()
    frames = timeline.append(audio(250)) + timeline.flush()
    assert [(f.seq, len(f.payload)) for f in frames] == [(0, 160), (1, 90)]
    assert timeline.next_seq == 2
    assert timeline.flush() == []


def test_longer_messages_hold_their_span_and_a_pause_and_the_end_keep_the_clock() -> None:
    timeline = LegTimeline(frame_samples=800)  # CALLQA_AUDIO_MESSAGE_MS=100
    frames = timeline.write(0, audio(500)) + timeline.write(500, audio(700))  # one whole message, 400 begun
    assert [(f.seq, len(f.payload)) for f in frames] == [(0, 800)]
    # Message 1 is completed with silence and sent; the pause (2300 samples) ends at sample 3500, inside
    # message 4, which begins with silence up to it; the leg's end sends message 5 short.
    frames = timeline.skip(2300) + timeline.append(audio(900, 9)) + timeline.flush()
    assert [(f.seq, len(f.payload)) for f in frames] == [(1, 800), (4, 800), (5, 400)]
    assert frames[0].payload == audio(400) + bytes([MULAW_SILENCE]) * 400
    assert frames[1].payload == bytes([MULAW_SILENCE]) * 300 + audio(500, 9)
    assert timeline.position == 6 * 800

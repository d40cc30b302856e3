"""Keypad tones (in-band DTMF) in a leg's audio: found, timed and silenced; which key it was is never kept.

Callers type card numbers and PINs on the keypad while the agent listens, and the tones are in the audio of
either leg (RFC 4733 events, out of band, are the SIPREC gateway's). ``KeypadDetector`` finds them in one
leg's stream of samples and lets the samples through with every tone replaced by silence, so no later stage
(the VAD, the recogniser, the kept recording) hears them. It reports when each tone was, on the leg's clock,
never which key: the key is told apart inside only to part one tone from the next, and then dropped.

How, after ITU-T Q.23 (rows 697/770/852/941 Hz, columns 1209/1336/1477/1633 Hz) and Q.24 (timings):

1. Every fifth of a window (41 samples, 5.1 ms at 8 kHz) a 205-sample window (25.6 ms, the classic Goertzel
   block: 39 Hz bins) is measured at the eight frequencies, each at -1 %, 0 and +1 % (a key may be 1.5 % off),
   and at their second harmonics: Goertzel's one DFT bin per frequency, every window and frequency at once
   as one matrix product. A window holds a key when one row and one column frequency each stand 8 dB above
   the rest of their group, both are loud enough, within Q.24's twist limits (the column from 8 dB below to
   4 dB above the row, and 1 dB more for the measurement's spread), together they carry 70 % of the
   window's energy, and neither has a second harmonic within 12 dB of it. Speech is harmonic and spread over
   the band; a keypad's two sines are neither: these checks keep talk-off (speech or music taken for a key)
   out. The share of energy does most of it: at 65 % one hold-music track had a key, at 70 % none of the
   103 minutes of speech and music measured has one (pipeline/audio/README.md).
2. Windows holding the same key one after another (a single miss bridged) make a candidate. Its edges are
   measured again sample by sample with a 10 ms window at its two frequencies (the tone lasts while both are
   above half their height) and it is a tone when it lasts 35 ms or more: Q.24 has tones of 40 ms taken and
   pauses of 40 ms parting them, and what lasts 30 ms or less is a blip, not a key. An interruption of 10 ms
   inside a tone does not part it (BRIDGE_MS).
3. Samples leave the detector once no tone can still reach them: 66 to 100 ms late, and while a
   candidate is open until it closes (at most MAX_RUN_S: a held key is cut into spans, merged again). Each
   tone is silenced GUARD_MS beyond its measured edges, so an edge measured a little short leaks nothing.

Any rate works (the windows are sized in time); 8 kHz is what telephony sends. Measured costs and the
talk-off count are in pipeline/audio/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

ROW_HZ = (697.0, 770.0, 852.0, 941.0)
COLUMN_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
WINDOW_S = 205 / 8000  # the Goertzel block most DTMF receivers use at 8 kHz
WINDOWS_PER_HOP = 5  # a window is measured every WINDOW_S / 5: 5.1 ms steps of the candidate's extent
EDGE_WINDOW_S = 0.010  # the edges are measured with this window: 10 ms is where Q.24's interruptions end
PROBES = (0.99, 1.0, 1.01)  # each frequency measured off by -1 % and +1 % too: Q.24 takes keys 1.5 % off
MIN_TONE_MS = 35  # Q.24: 40 ms and longer is a tone; here 30 ms and shorter is not, so the line is between
# Q.24: an interruption of up to 10 ms does not part a tone. A dropout measures a little wider than it is
# (the sines' phases jump across it), and pauses that part tones are 40 ms and longer: 15 ms is bridged.
BRIDGE_MS = 15
GUARD_MS = 10  # silenced beyond each measured edge
MAX_RUN_S = 0.5  # a candidate held open longer is closed and another opened (bounds what is held back)
MIN_WINDOWS = 8  # windows measured at once at the least (40 ms of hops), but at the stream's end
# Per-window checks. Levels are of one frequency's sine amplitude (full scale 1.0): -40 dBFS is about
# -37 dBm0 in G.711, below what a keypad sends after any line loss (Q.24 takes keys down to -25 dBm0).
MIN_LEVEL = 10 ** (-40 / 20)
RELATIVE_PEAK = 10 ** (8 / 10)  # the row (column) frequency over the next strongest of its group
# Twist: Q.24's 8 dB (row above column) and 4 dB (column above row), each 1 dB wider: a key exactly at the
# limit measures within +-0.5 dB of it from window to window.
NORMAL_TWIST = 10 ** (9 / 10)  # how far the row may be above the column
REVERSE_TWIST = 10 ** (5 / 10)  # how far the column may be above the row
TONE_SHARE = 0.7  # of the window's energy that the two sines carry
SECOND_HARMONIC = 10 ** (-12 / 10)  # the most a frequency's second harmonic may carry against it
# Keys 1.5 % off lose up to ~60 % of their power in the bins at the exact frequencies, so a window whose best
# row and column there carry less than this share cannot pass TONE_SHARE (only the few others are measured in full).
GATE_SHARE = 0.25

_TONES = (*ROW_HZ, *COLUMN_HZ)


@dataclass(frozen=True)
class ToneSpan:
    """One keypad tone, [start_ms, end_ms) on the leg's clock. No key: which one it was is never kept."""

    start_ms: int
    end_ms: int

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class KeypadSnapshot:
    """Where a detector stood (a leg's checkpoint carries it): a restored one goes on with the same output."""

    released: int  # samples let out so far; ``audio`` starts there
    rescan: int  # the first window not yet settled: analysis resumes there
    audio: np.ndarray = field(repr=False)  # the samples held back (float32)
    spans: tuple[tuple[int, int], ...] = ()  # the tones so far, [start, end) in samples


@dataclass
class _Run:
    """Consecutive windows holding one key (internal: the key never leaves this module)."""

    key: int
    first: int  # window starts, in samples
    last: int
    misses: int = 0


class KeypadDetector:
    """One leg's keypad tones: ``process`` chunks of any size, ``flush`` at the end (or ``skip`` a gap)."""

    def __init__(self, sample_rate: int = 8000) -> None:
        if 2 * max(_TONES) * PROBES[-1] >= sample_rate / 2:
            raise ValueError(f"{sample_rate} Hz is too low a rate for keypad tones and their harmonics")
        self.sample_rate = sample_rate
        self._n = round(WINDOW_S * sample_rate)
        self._hop = max(1, self._n // WINDOWS_PER_HOP)
        self._edge = round(EDGE_WINDOW_S * sample_rate)
        self._guard = GUARD_MS * sample_rate // 1000
        self._bridge = BRIDGE_MS * sample_rate // 1000
        self._min_tone = MIN_TONE_MS * sample_rate // 1000
        self._max_run = round(MAX_RUN_S * sample_rate)
        self._basis, self._nominal, self._leak = _tables(sample_rate, self._n)
        # Energy (sum of squares) of a sine at MIN_LEVEL over a window, and of two: quieter windows are skipped.
        self._min_energy = MIN_LEVEL**2 * self._n / 2
        self._buf = np.zeros(0, dtype=np.float32)  # held samples, from self._base
        self._base = 0  # samples let out so far
        self._next = 0  # start of the next window to measure
        self._run: _Run | None = None
        self._spans: list[list[int]] = []

    # ---- the stream --------------------------------------------------------------------------------
    def process(self, samples: np.ndarray) -> np.ndarray:
        """Take ``samples``; the samples now let out (earlier ones first), keypad tones silenced."""
        chunk = np.asarray(samples, dtype=np.float32)
        self._buf = np.concatenate([self._buf, chunk]) if self._buf.size else chunk.copy()
        self._analyse(final=False)
        return self._release(final=False)

    def flush(self) -> np.ndarray:
        """End of the stream: every sample still held, tones silenced (a tone running into the end counts)."""
        self._analyse(final=True)
        return self._release(final=True)

    def skip(self, samples: int) -> np.ndarray:
        """A stretch of ``samples`` of digital silence that is not passed through (a hold): ``flush``, and
        the clock moves on past it. Returns what ``flush`` does."""
        out = self.flush()
        self._base += samples
        self._next = self._base
        return out

    @property
    def spans(self) -> list[ToneSpan]:
        """The tones found so far, in order."""
        rate = self.sample_rate
        return [ToneSpan(a * 1000 // rate, -(-b * 1000 // rate)) for a, b in self._spans]

    @property
    def held(self) -> int:
        """Samples taken but not yet let out."""
        return int(self._buf.size)

    @property
    def samples_in(self) -> int:
        return self._base + self.held

    def snapshot(self) -> KeypadSnapshot:
        rescan = self._run.first if self._run is not None else self._next
        return KeypadSnapshot(self._base, rescan, self._buf.copy(), tuple((a, b) for a, b in self._spans))

    @classmethod
    def restored(cls, sample_rate: int, snap: KeypadSnapshot) -> KeypadDetector:
        """A detector that goes on from ``snap``: the windows of a candidate open then are measured again from
        the held samples, so the output is the one an uninterrupted detector gives."""
        detector = cls(sample_rate)
        detector._base = snap.released
        detector._buf = np.asarray(snap.audio, dtype=np.float32).copy()
        detector._next = max(snap.rescan, snap.released)
        detector._spans = [[int(a), int(b)] for a, b in snap.spans]
        return detector

    @classmethod
    def at(cls, sample_rate: int, position: int) -> KeypadDetector:
        """A fresh detector whose stream has already let ``position`` samples out (a leg resumed from a
        checkpoint that has no detector state: a tone that spanned it may be missed, nothing else changes)."""
        detector = cls(sample_rate)
        detector._base = detector._next = position
        return detector

    # ---- measuring ------------------------------------------------------------------------------------
    def _analyse(self, final: bool) -> None:
        n, hop = self._n, self._hop
        end = self._base + self._buf.size
        count = (end - self._next - n) // hop + 1 if end - self._next >= n else 0
        # Windows are measured a few at a time (numpy's cost per call, not per window, dominates small chunks):
        # 20 ms messages are taken in pairs, which delays what is let out by as much.
        if count >= (1 if final else MIN_WINDOWS):
            at = self._next - self._base
            frames = np.lib.stride_tricks.as_strided(
                self._buf[at:], (count, n), (hop * self._buf.strides[0], self._buf.strides[0]), writeable=False)
            keys = self._classify(frames)
            hits = np.flatnonzero(keys >= 0)
            i = 0 if self._run is not None else (int(hits[0]) if hits.size else count)
            while i < count:
                self._step(self._next + i * hop, int(keys[i]))
                i += 1
                if self._run is None:  # on to the next window holding a key
                    later = hits[np.searchsorted(hits, i):]
                    i = int(later[0]) if later.size else count
            self._next += count * hop
        if final and self._run is not None:
            self._close(self._run, end)
            self._run = None

    def _step(self, start: int, key: int) -> None:
        """One window's verdict (``key`` -1: none) into the open candidate."""
        run = self._run
        if run is None:
            if key >= 0:
                self._run = _Run(key, start, start)
            return
        if key == run.key:
            run.last, run.misses = start, 0
            if start - run.first >= self._max_run:
                self._close(run, start + self._n)
                self._run = None
        elif key < 0:
            run.misses += 1
            if run.misses >= 2:
                self._close(run, start + self._n)
                self._run = None
        else:
            self._close(run, start + self._n)
            self._run = _Run(key, start, start)

    def _classify(self, frames: np.ndarray) -> np.ndarray:
        """Per window, the key it holds (0..15, row * 4 + column) or -1."""
        keys = np.full(len(frames), -1, dtype=np.int8)
        energy = np.einsum("ij,ij->i", frames, frames)
        loud = np.flatnonzero(energy >= 2 * self._min_energy)
        if not loud.size:
            return keys
        # First the eight frequencies as they are: a window whose best row and column carry under GATE_SHARE
        # of its energy cannot pass, even with both keys 1.5 % off (the rest of the checks are skipped).
        x = np.ascontiguousarray(frames[loud], dtype=np.float32)
        nominal = _power(x @ self._nominal)
        best = nominal[:, :4].max(axis=1) + nominal[:, 4:].max(axis=1)
        near = np.flatnonzero(2 * best / self._n >= GATE_SHARE * energy[loud])
        if not near.size:
            return keys
        loud, x = loud[near], x[near]
        power = _power(x @ self._basis).astype(np.float64)
        probes = len(PROBES)
        tone = power[:, : len(_TONES) * probes].reshape(len(loud), len(_TONES), probes).max(axis=2)
        harmonic = power[:, len(_TONES) * probes:]
        rows, cols = tone[:, :4], tone[:, 4:]
        r, c = rows.argmax(axis=1), cols.argmax(axis=1)
        k = np.arange(len(loud))
        pr, pc = rows[k, r], cols[k, c]
        # A sine of amplitude A over n samples: bin power (A n / 2)^2, energy A^2 n / 2 = 2 power / n.
        er, ec = 2 * pr / self._n, 2 * pc / self._n
        ok = (er >= self._min_energy) & (ec >= self._min_energy)
        ok &= pr >= RELATIVE_PEAK * np.partition(rows, 2, axis=1)[:, 2]
        ok &= pc >= RELATIVE_PEAK * np.partition(cols, 2, axis=1)[:, 2]
        ok &= (pr <= NORMAL_TWIST * pc) & (pc <= REVERSE_TWIST * pr)
        ok &= er + ec >= TONE_SHARE * energy[loud]
        # A second harmonic's bin, less what the other frequency's own sine leaks into it (2 x 770 Hz is
        # 1.6 bins from 1477 Hz): a key 4 dB reverse twisted must not read as a harmonic-rich sound.
        leak = self._leak[r, c]
        ok &= harmonic[k, r] <= SECOND_HARMONIC * pr + leak[:, 0] * pc
        ok &= harmonic[k, 4 + c] <= SECOND_HARMONIC * pc + leak[:, 1] * pr
        keys[loud[ok]] = (r[ok] * 4 + c[ok]).astype(np.int8)
        return keys

    def _close(self, run: _Run, region_end: int) -> None:
        """A candidate ended: measure its edges; keep what lasts long enough as tones."""
        a = max(self._base, run.first - self._n)
        b = min(region_end, self._base + self._buf.size)
        x = self._buf[a - self._base: b - self._base].astype(np.float64)
        if x.size == 0:
            return
        row = self._envelope(x, ROW_HZ[run.key // 4])
        col = self._envelope(x, COLUMN_HZ[run.key % 4])
        # The windows' centres: where the tone certainly was.
        lo = min(max(run.first + self._n // 2 - a, 0), x.size - 1)
        hi = min(max(run.last + self._n // 2 - a, lo), x.size - 1) + 1
        on = (row >= 0.5 * row[lo:hi].max()) & (col >= 0.5 * col[lo:hi].max())
        for start, stop in _stretches(on, self._bridge):
            if stop > lo and start < hi and stop - start >= self._min_tone:
                self._add(a + start, a + stop)

    def _envelope(self, x: np.ndarray, hz: float) -> np.ndarray:
        """Amplitude at ``hz`` around each sample: one DFT bin over the ``EDGE_WINDOW_S`` centred on it."""
        t = np.arange(x.size)
        sums = np.concatenate([[0j], np.cumsum(x * np.exp(-2j * np.pi * hz / self.sample_rate * t))])
        m = self._edge
        lo, hi = np.clip(t - m // 2, 0, x.size), np.clip(t + m - m // 2, 0, x.size)
        return np.abs(sums[hi] - sums[lo])

    def _add(self, start: int, end: int) -> None:
        last = self._spans[-1] if self._spans else None
        if last is not None and start <= last[1] + self._bridge:
            last[0], last[1] = min(last[0], start), max(last[1], end)
        else:
            self._spans.append([start, end])

    def _release(self, final: bool) -> np.ndarray:
        """Let out the samples no tone can still reach, tones (and their guards) silenced."""
        end = self._base + self._buf.size
        safe = end
        if not final:
            # A window measured later starts at self._next; a tone it finds starts at most a window before.
            safe = self._next - self._n - self._guard
            if self._run is not None:
                safe = min(safe, self._run.first - self._n - self._guard)
        safe = min(safe, end)
        if safe <= self._base:
            return np.zeros(0, dtype=np.float32)
        out = self._buf[: safe - self._base].copy()
        for a, b in reversed(self._spans):
            if b + self._guard <= self._base:
                break
            out[max(0, a - self._guard - self._base): max(0, b + self._guard - self._base)] = 0.0
        self._buf = self._buf[safe - self._base:]
        self._base = safe
        return out


@lru_cache(maxsize=8)
def _tables(rate: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What every detector at ``rate`` measures with (made once per rate): the basis of every frequency (the
    tones at each probe, then their second harmonics), the basis of the tones alone, and ``_leakage``."""
    basis = _basis(rate, [f * p for f in _TONES for p in PROBES] + [2 * f for f in _TONES], n)
    nominal = _basis(rate, list(_TONES), n)
    leak = _leakage(basis, rate, n)
    for table in (basis, nominal, leak):
        table.setflags(write=False)
    return basis, nominal, leak


def _basis(rate: int, hz: list[float], n: int) -> np.ndarray:
    """[n, 2F] float32: the cosines then the sines of ``hz`` over a window (one DFT bin each)."""
    phase = 2 * np.pi * np.outer(np.arange(n), hz) / rate
    return np.ascontiguousarray(np.concatenate([np.cos(phase), np.sin(phase)], axis=1), dtype=np.float32)


def _leakage(basis: np.ndarray, rate: int, n: int) -> np.ndarray:
    """[row, column, 2]: the most power a key's column sine puts in its row's second-harmonic bin, against the
    column's own (measured) power, and the same of the row sine in the column's; twice the worst over phases
    and the 1.5 % Q.24 lets a key be off, so a clean key is never taken for a harmonic-rich sound."""
    probes = len(PROBES)
    offsets, phases = np.meshgrid([0.985, 1.0, 1.015], np.linspace(0, np.pi, 8, endpoint=False))
    t = np.arange(n)
    out = np.zeros((4, 4, 2))
    for r in range(4):
        for c in range(4):
            for j, (sine, other) in enumerate(((4 + c, r), (r, 4 + c))):
                hz = _TONES[sine] * offsets.reshape(-1, 1)
                x = np.sin(2 * np.pi * hz * t / rate + phases.reshape(-1, 1)).astype(np.float32)
                power = _power(x @ basis)
                own = power[:, sine * probes:(sine + 1) * probes].max(axis=1)
                out[r, c, j] = 2 * (power[:, len(_TONES) * probes + other] / own).max()
    return out


def _power(y: np.ndarray) -> np.ndarray:
    """Bin powers from ``_basis`` products: cosine part squared plus sine part squared."""
    half = y.shape[1] // 2
    return y[:, :half] ** 2 + y[:, half:] ** 2


def _stretches(on: np.ndarray, bridge: int) -> list[tuple[int, int]]:
    """The runs of True in ``on`` as [start, stop), runs parted by ``bridge`` False or fewer joined."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    out: list[tuple[int, int]] = []
    for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        if out and start - out[-1][1] <= bridge:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def detect_tones(samples: np.ndarray, sample_rate: int = 8000) -> list[ToneSpan]:
    """The keypad tones of a whole recording (one leg)."""
    detector = KeypadDetector(sample_rate)
    detector.process(samples)
    detector.flush()
    return detector.spans


def silence_tones(samples: np.ndarray, sample_rate: int, spans: list[ToneSpan] | tuple[ToneSpan, ...],
                  guard_ms: int = GUARD_MS) -> np.ndarray:
    """A copy of ``samples`` (a leg from its start) with each span, and ``guard_ms`` either side, silenced."""
    out = np.array(samples, dtype=np.float32, copy=True)
    for span in spans:
        a = max(0, (span.start_ms - guard_ms) * sample_rate // 1000)
        b = max(0, -(-(span.end_ms + guard_ms) * sample_rate // 1000))
        out[a:b] = 0.0
    return out

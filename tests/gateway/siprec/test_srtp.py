"""SDES-keyed SRTP: round trips of packetized legs, authentication and replay failures, SSRC changes under
one key, choosing among a=crypto lines read by the SDP parser, our answer's key, and a fuzz loop."""

from __future__ import annotations

import base64
import random
import timeit
from functools import partial

import numpy as np
import pytest

from pipeline.gateway.siprec.rtp import parse_rtp
from pipeline.gateway.siprec.rtp_send import impair, packetize
from pipeline.gateway.siprec.sdp import Crypto, parse_sdp
from pipeline.gateway.siprec.srtp import (
    MAX_SSRCS,
    SUITES,
    SrtpError,
    SrtpReceiver,
    SrtpSender,
    answer_crypto,
    choose,
    key_params,
    new_crypto,
    supported,
)

# 30 bytes of base64 (16 key + 14 salt), as in RFC 4568's examples.
KEY = "inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"
SHORT_KEY = "inline:" + base64.b64encode(bytes(29)).decode()


def _leg(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0, 3000, int(seconds * 8000)), -32768, 32767).astype(np.int16)


def _packets(seconds: float = 1.0, ssrc: int = 0x1234, first_sequence: int = 0) -> list[bytes]:
    return packetize(_leg(seconds), "pcmu", 0, ssrc=ssrc, first_sequence=first_sequence)


def _flip(packet: bytes, index: int) -> bytes:
    return packet[:index] + bytes((packet[index] ^ 0x01,)) + packet[index + 1:]


@pytest.mark.parametrize("suite", SUITES)
def test_round_trip_of_a_leg_across_the_sequence_wrap(suite: str) -> None:
    crypto = new_crypto(suite=suite)
    packets = _packets(2.0, first_sequence=65500)  # 100 packets, the sequence wraps after 36
    sender, receiver = SrtpSender(crypto), SrtpReceiver(crypto)
    protected = [sender.protect(p) for p in packets]
    tag = 10 if suite.endswith("_80") else 4
    assert [len(s) for s in protected] == [len(p) + tag for p in packets]
    assert all(s[:12] == p[:12] and s[12:-tag] != p[12:] for s, p in zip(protected, packets, strict=True))
    assert [receiver.unprotect(s) for s in protected] == packets


def test_reordered_and_lost_packets_still_decrypt() -> None:
    crypto = new_crypto()
    sender, receiver = SrtpSender(crypto), SrtpReceiver(crypto)
    packets = _packets(4.0)
    arriving = impair([sender.protect(p) for p in packets], loss=0.05, reorder=0.2, seed=3)
    plain = [receiver.unprotect(s) for s in arriving]
    assert sorted(plain, key=lambda p: parse_rtp(p).sequence) == [p for p in packets if p in set(plain)]
    assert len(plain) == len(arriving)


@pytest.mark.parametrize("where", ["tag", "payload", "header"])
def test_a_flipped_bit_fails_authentication_and_costs_nothing(where: str) -> None:
    crypto = new_crypto()
    packet = SrtpSender(crypto).protect(_packets(0.02)[0])
    index = {"tag": len(packet) - 1, "payload": 40, "header": 3}[where]
    receiver = SrtpReceiver(crypto)
    with pytest.raises(SrtpError, match="authentication failure") as failed:
        receiver.unprotect(_flip(packet, index))
    assert failed.value.reason == "auth"
    # A forged packet must not use up the genuine one's index in the replay window.
    assert receiver.unprotect(packet) == _packets(0.02)[0]


def test_a_wrong_key_fails_authentication() -> None:
    packet = SrtpSender(new_crypto()).protect(_packets(0.02)[0])
    with pytest.raises(SrtpError, match=r"SSRC 0x00001234, sequence 0\): authentication failure"):
        SrtpReceiver(new_crypto()).unprotect(packet)
    # Same key, other suite: the 32-bit tag reads the last 4 bytes of the 80-bit one.
    crypto = new_crypto()
    other = Crypto(crypto.tag, "AES_CM_128_HMAC_SHA1_32", crypto.key_params)
    with pytest.raises(SrtpError, match="authentication failure"):
        SrtpReceiver(other).unprotect(SrtpSender(crypto).protect(_packets(0.02)[0]))


def test_replays_are_refused() -> None:
    crypto = new_crypto()
    sender, receiver = SrtpSender(crypto), SrtpReceiver(crypto)
    packets = _packets(6.0)  # 300 packets
    protected = [sender.protect(p) for p in packets]
    receiver.unprotect(protected[0])
    with pytest.raises(SrtpError, match="replay check failed") as failed:
        receiver.unprotect(protected[0])
    assert failed.value.reason == "replay"
    for packet in protected[1:]:
        receiver.unprotect(packet)
    with pytest.raises(SrtpError, match="replay") as failed:  # far behind the replay window
        receiver.unprotect(protected[10])
    assert failed.value.reason == "replay"
    # The sender protects its latest packet again when asked (a resend); only the receiver refuses it.
    assert sender.protect(packets[-1]) == protected[-1]
    with pytest.raises(SrtpError, match="replay"):
        receiver.unprotect(protected[-1])


def test_one_receiver_follows_an_ssrc_change() -> None:
    crypto = new_crypto()
    sender, receiver = SrtpSender(crypto), SrtpReceiver(crypto)
    before = _packets(1.0, ssrc=0xAAAA, first_sequence=100)
    after = _packets(1.0, ssrc=0xBBBB, first_sequence=40000)  # an SBC failover: new SSRC and numbering
    first = [sender.protect(p) for p in before]
    second = [sender.protect(p) for p in after]
    assert [receiver.unprotect(s) for s in first + second] == before + after
    with pytest.raises(SrtpError, match="replay"):  # each SSRC keeps its own replay window
        receiver.unprotect(first[-1])
    back = _packets(0.2, ssrc=0xAAAA, first_sequence=150)
    assert [receiver.unprotect(sender.protect(p)) for p in back] == back


def test_ssrcs_per_receiver_are_bounded() -> None:
    crypto = new_crypto()
    sender, receiver = SrtpSender(crypto), SrtpReceiver(crypto)
    for ssrc in range(1, MAX_SSRCS + 1):
        receiver.unprotect(sender.protect(_packets(0.02, ssrc=ssrc)[0]))
    extra = sender.protect(_packets(0.02, ssrc=MAX_SSRCS + 1)[0])
    for _ in range(2):  # refused every time, not admitted on a second try
        with pytest.raises(SrtpError, match=f"more than {MAX_SSRCS} SSRCs") as failed:
            receiver.unprotect(extra)
        assert failed.value.reason == "ssrc_limit"
    later = _packets(0.04, ssrc=1)[1]
    assert receiver.unprotect(sender.protect(later)) == later


def _offer(*crypto_lines: str) -> tuple[Crypto, ...]:
    sdp = ("v=0\r\no=SBC 1 1 IN IP4 198.51.100.20\r\ns=-\r\nc=IN IP4 198.51.100.20\r\nt=0 0\r\n"
           "m=audio 49170 RTP/SAVP 0\r\na=sendonly\r\na=label:1\r\n"
           + "".join(f"a=crypto:{line}\r\n" for line in crypto_lines))
    return parse_sdp(sdp).media[0].crypto


def test_choose_skips_what_we_cannot_use() -> None:
    offered = _offer(
        f"1 AEAD_AES_256_GCM {KEY}",  # unknown suite
        f"2 AES_CM_128_HMAC_SHA1_80 {KEY}|2^20|1:4",  # MKI
        "3 AES_CM_128_HMAC_SHA1_80 inline:not*base64*at*all",
        f"4 AES_CM_128_HMAC_SHA1_80 {SHORT_KEY}",
        f"5 AES_CM_128_HMAC_SHA1_80 {KEY};{KEY}",  # two master keys
        f"6 AES_CM_128_HMAC_SHA1_80 {KEY}|2^49",  # lifetime beyond the suite's
        f"7 AES_CM_128_HMAC_SHA1_32 {KEY}|2^20 KDR=0",
        f"8 AES_CM_128_HMAC_SHA1_80 {KEY}",
    )
    assert [supported(c) for c in offered] == [False] * 6 + [True, True]
    chosen = choose(offered)
    assert chosen is not None and (chosen.tag, chosen.suite) == (7, "AES_CM_128_HMAC_SHA1_32")
    assert choose(offered[:6]) is None and choose(()) is None


@pytest.mark.parametrize(("params", "lifetime"), [
    (KEY, None), (f"{KEY}|2^20", 2**20), (f"{KEY}|1048576", 2**20), (f"{KEY}|2^48", 2**48),
])
def test_key_params_read_lifetimes(params: str, lifetime: int | None) -> None:
    read = key_params(Crypto(1, "AES_CM_128_HMAC_SHA1_80", params))
    assert read.lifetime == lifetime and read.key_salt == base64.b64decode(KEY.removeprefix("inline:"))
    assert KEY.removeprefix("inline:") not in repr(read) and "key_salt" not in repr(read)


@pytest.mark.parametrize(("params", "message"), [
    (f"{KEY}|1:4", "MKI"), (f"{KEY}|2^20|1:32", "MKI"), (f"{KEY}|0", "lifetime"), (f"{KEY}|2^x", "lifetime"),
    (f"{KEY}|2^20|2^20", "two lifetimes"), (f"{KEY}|2^20|1:4|x", "'|' fields"), ("inline:", "30"),
    (SHORT_KEY, "29 bytes, expected 30"), ("inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVB", "not base64"),
    ("inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBé", "not base64"), ("key:" + KEY[7:], "inline:"),
    (KEY + "|" + "9" * 300, "more than 256"),
])
def test_key_params_refusals_name_the_problem(params: str, message: str) -> None:
    with pytest.raises(SrtpError, match=message) as failed:
        key_params(Crypto(3, "AES_CM_128_HMAC_SHA1_80", params))
    assert failed.value.reason == "key" and str(failed.value).startswith("a=crypto tag 3:")
    assert KEY[7:] not in str(failed.value)


def test_answer_crypto_keeps_tag_and_suite_with_our_own_key() -> None:
    chosen = choose(_offer(f"9 AES_CM_128_HMAC_SHA1_32 {KEY}|2^31"))
    assert chosen is not None
    ours, again = answer_crypto(chosen), answer_crypto(chosen)
    assert (ours.tag, ours.suite) == (9, "AES_CM_128_HMAC_SHA1_32") and supported(ours)
    assert len({ours.key_params, again.key_params, chosen.key_params}) == 3
    assert key_params(ours).lifetime is None
    with pytest.raises(SrtpError, match="suite"):
        answer_crypto(Crypto(1, "F8_128_HMAC_SHA1_80", KEY))


def test_new_crypto() -> None:
    one, two = new_crypto(), new_crypto(tag=2, suite="AES_CM_128_HMAC_SHA1_32")
    assert (one.tag, one.suite, two.tag, two.suite) == (1, SUITES[0], 2, SUITES[1])
    assert one.key_params != new_crypto().key_params and supported(one) and supported(two)
    with pytest.raises(SrtpError, match="suite") as failed:
        new_crypto(suite="AES_256_CM_HMAC_SHA1_80")
    assert failed.value.reason == "suite"
    with pytest.raises(SrtpError, match="tag"):
        new_crypto(tag=10**9)
    with pytest.raises(SrtpError, match="suite"):
        SrtpReceiver(Crypto(1, "NULL_HMAC_SHA1_80", KEY))


def test_protect_bounds() -> None:
    sender = SrtpSender(new_crypto())
    for size in (0, 11, 1357):
        with pytest.raises(SrtpError, match=f"RTP packet of {size} bytes") as failed:
            sender.protect(bytes(size))
        assert failed.value.reason == "protect"


def test_fuzz_unprotect_raises_only_srtp_error() -> None:
    rng = random.Random(7)
    crypto = new_crypto()
    receiver = SrtpReceiver(crypto)
    genuine = [SrtpSender(crypto).protect(p) for p in _packets(1.0)]
    for _ in range(3000):
        size = rng.choice((rng.randrange(0, 40), rng.randrange(0, 1600)))
        with pytest.raises(SrtpError):
            receiver.unprotect(rng.randbytes(size))
    for _ in range(3000):
        packet = bytearray(rng.choice(genuine))
        action = rng.randrange(3)
        if action == 0:
            for _ in range(rng.randint(1, 4)):
                packet[rng.randrange(len(packet))] ^= 1 << rng.randrange(8)
        elif action == 1:
            del packet[rng.randrange(len(packet)):]
        else:
            packet[rng.randrange(len(packet)):rng.randrange(len(packet))] = rng.randbytes(rng.randrange(1, 30))
        if bytes(packet) in genuine:
            continue
        with pytest.raises(SrtpError):  # an 80-bit tag: a mutated packet never passes
            receiver.unprotect(bytes(packet))
    # The fuzzing left the genuine stream untouched.
    assert [receiver.unprotect(s) for s in genuine] == _packets(1.0)


def test_unprotect_cost_per_packet() -> None:
    """Prints the cost of one unprotect of a 172-byte RTP packet (PCMU, 20 ms); no timing assert."""
    crypto = new_crypto()
    packets = _packets(200.0)  # 10,000 packets of 172 bytes
    assert {len(p) for p in packets} == {172}
    protected = [SrtpSender(crypto).protect(p) for p in packets]
    # A fresh receiver each round: the replay window refuses a packet unprotected before.
    best = min(timeit.timeit(partial(_unprotect_all, SrtpReceiver(crypto), protected), number=1) for _ in range(5))
    print(f"\nSRTP unprotect of a 172-byte RTP packet ({len(protected[0])} bytes SRTP): "
          f"{best / len(protected) * 1e6:.2f} us per packet")


def _unprotect_all(receiver: SrtpReceiver, protected: list[bytes]) -> None:
    for packet in protected:
        receiver.unprotect(packet)

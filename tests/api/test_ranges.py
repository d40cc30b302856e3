"""Byte ranges as a client may write them, hostile ones included: a position of thousands of digits is past any
file (416 for a start, the end of the file for an end), digits of other scripts are not a range."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.api.ranges import ByteRange, RangeNotSatisfiable, byte_range

HUGE = "9" * 5000  # past int()'s default limit on digits (4300)


def test_a_start_of_thousands_of_digits_is_past_the_end() -> None:
    with pytest.raises(RangeNotSatisfiable, match=r"^bytes \*/1000$"):
        byte_range(f"bytes={HUGE}-", 1000)
    with pytest.raises(RangeNotSatisfiable):
        byte_range(f"bytes={HUGE}-{HUGE}", 1000)


def test_an_end_or_a_suffix_of_thousands_of_digits_is_the_rest_of_the_file() -> None:
    assert byte_range(f"bytes=10-{HUGE}", 1000) == ByteRange(10, 1000, 1000)
    assert byte_range(f"bytes=-{HUGE}", 1000) == ByteRange(0, 1000, 1000)
    assert byte_range("bytes=" + "0" * 5000 + "5-9", 1000) == ByteRange(5, 10, 1000)  # zeros are not length


def test_digits_of_other_scripts_are_not_a_range() -> None:
    assert byte_range("bytes=\u0661\u0662-", 1000) is None  # Arabic-Indic 12: the whole file
    assert byte_range("bytes=1-\uff19", 1000) is None  # a fullwidth 9


DIGITS = st.text(alphabet="0123456789", max_size=5000)
HEADERS = st.one_of(st.text(max_size=60), st.builds(lambda a, b: f"bytes={a}-{b}", DIGITS, DIGITS))


@given(HEADERS, st.integers(min_value=1, max_value=10**6))
def test_any_header_is_a_range_of_the_file_the_whole_or_unsatisfiable(header: str, size: int) -> None:
    try:
        wanted = byte_range(header, size)
    except RangeNotSatisfiable:
        return
    assert wanted is None or 0 <= wanted.start < wanted.end <= size

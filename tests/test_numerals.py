"""fleetlog.numerals (issue 46): numbers from clients and files are ASCII digits only."""

from __future__ import annotations

import pytest

from fleetlog.numerals import whole


@pytest.mark.parametrize("text", ["²", "١", "٣", "０", "߁", "-1", "+1", " 1", "1 ", "1e3", "0x10", "", "1_0"])
def test_anything_but_ascii_digits_is_no_number(text: str) -> None:
    """``²``, ``١``, ``٣``, ``０`` and ``߁`` pass ``str.isdigit()``; ``int()`` takes all but ``²``."""
    assert whole(text) is None


def test_ascii_digits_are_the_number_they_spell_within_the_digits_allowed() -> None:
    assert whole("0") == 0
    assert whole("0042") == 42
    assert whole("9" * 18, 18) == 10**18 - 1
    assert whole("9" * 19, 18) is None

"""Whole numbers in text a client or a file sent: ASCII digits only.

``str.isdigit()`` is true of ``²`` and ``١``: ``int("²")`` then raises (a 500 where a 400 was
meant) and ``int("١")`` is 1 (an offset nobody wrote).  Every parser of a number in a query
parameter, a header or a name takes it through :func:`whole`.
"""

from __future__ import annotations

import re
from typing import Final

_DIGITS: Final = re.compile(r"[0-9]+")


def whole(text: str, max_digits: int | None = None) -> int | None:
    """The non-negative integer ``text`` spells in ASCII digits (at most ``max_digits`` of them),
    else ``None``: no sign, no space, no other script's digits."""
    if _DIGITS.fullmatch(text) is None or (max_digits is not None and len(text) > max_digits):
        return None
    return int(text)

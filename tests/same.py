"""``assert_same(fast, plain, where)``: the twin tests' comparison of large values, failing
with where they first differ. Not a bare ``assert fast == plain``: on a failure pytest
explains it with a difflib diff of the two reprs, untruncated when ``CI`` is set, and on a
step of thousands of dispatches that diff ran past the suite's 600 s timeout — a broken fast
path hung the suite instead of failing it (tests/core/test_dispatch_runs.py's break cases;
pytest runs its own explanation whatever a ``pytest_assertrepr_compare`` hook returns)."""

from __future__ import annotations


def assert_same(left: object, right: object, where: str) -> None:
    """``left == right``, or an AssertionError naming ``where`` and the first difference."""
    if left != right:
        raise AssertionError("\n".join([f"{where}: not the same", *first_difference(left, right, "", 8)]))


def first_difference(left: object, right: object, path: str, depth: int) -> list[str]:
    """The path to the first place ``left`` and ``right`` differ (an index of a sequence, a
    key of a mapping, a field of a struct or dataclass; ``depth`` levels down at most), with
    both values there, shortened."""
    def short(value: object) -> str:
        text = repr(value)
        return text if len(text) <= 400 else f"{text[:400]}... ({len(text)} characters)"

    if depth > 0 and type(left) is type(right):
        if isinstance(left, (list, tuple)):
            assert isinstance(right, (list, tuple))
            for i, (a, b) in enumerate(zip(left, right, strict=False)):
                if a != b:
                    return first_difference(a, b, f"{path}[{i}]", depth - 1)
            if len(left) != len(right):
                longer = left if len(left) > len(right) else right
                return [f"{path or 'value'}: lengths {len(left)} != {len(right)}; first extra item "
                        f"{short(longer[min(len(left), len(right))])}"]
        elif isinstance(left, dict):
            assert isinstance(right, dict)
            only = sorted(set(left) ^ set(right), key=repr)
            if only:
                return [f"{path}[{only[0]!r}]: only on the {'left' if only[0] in left else 'right'}"]
            for key in left:
                if left[key] != right[key]:
                    return first_difference(left[key], right[key], f"{path}[{key!r}]", depth - 1)
        else:
            fields = getattr(left, "__struct_fields__", None) or getattr(left, "__dataclass_fields__", None)
            for name in fields or ():
                a, b = getattr(left, name), getattr(right, name)
                if a != b:
                    return first_difference(a, b, f"{path}.{name}", depth - 1)
    return [f"{path or 'value'}:", f"  left:  {short(left)}", f"  right: {short(right)}"]

"""Growable struct-of-arrays tables and a deterministic string interner.

Every table grows by doubling; rows are never reordered or reused between two compactions
(retired jobs' rows dropped, the rest renumbered in order, at points the log decides), so a row
id derives only from the order of the log.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
HASH_MASK = (1 << 64) - 1


def entry_hash(entry: tuple[Any, ...]) -> int:
    """A 64-bit BLAKE2b of one entry's msgpack bytes: same entry, same hash, in any process."""
    return int.from_bytes(hashlib.blake2b(msgspec.msgpack.encode(entry), digest_size=8).digest(), "little")


def entries_sum(entries: Any) -> int:
    """The order-free hash of a collection of entries (tuples): the sum of their entry hashes
    mod 2**64. Fold keeps such sums up to date entry by entry (add the new entry's hash,
    subtract the old one's), so the digest need not read the whole collection."""
    return sum(map(entry_hash, entries)) & HASH_MASK


class Interner:
    """Strings to dense ids in first-seen order (so ids depend on the log, not on hashing)."""

    __slots__ = ("_hash", "_unhashed", "ids", "names")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self._hash = hashlib.blake2b(digest_size=16)
        self._unhashed: list[str] = []
        """Names :meth:`add`-ed whose bytes the running hash has not taken yet (in order)."""

    def __len__(self) -> int:
        return len(self.names)

    def intern(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            if self._unhashed:
                self._hash_added()  # (the hash takes the names in interning order)
            found = self.ids[name] = len(self.names)
            self.names.append(name)
            self._hash.update(name.encode("utf-8", "surrogatepass") + b"\x00")
        return found

    def add(self, name: str) -> int:
        """:meth:`intern` of a name known to be new, its bytes hashed later with the other names
        added since, in one update (a run of new jobs: the same running hash, one call)."""
        found = self.ids[name] = len(self.names)
        self.names.append(name)
        self._unhashed.append(name)
        return found

    def add_many(self, names: list[str]) -> None:
        """:meth:`add` of each of ``names`` (distinct, none interned yet), in order."""
        start = len(self.names)
        self.ids.update(zip(names, range(start, start + len(names)), strict=True))
        self.names.extend(names)
        self._unhashed.extend(names)

    def _hash_added(self) -> None:
        # the names joined by NUL, then one NUL: the bytes :meth:`intern` hashes name by name
        self._hash.update("\x00".join(self._unhashed).encode("utf-8", "surrogatepass") + b"\x00")
        self._unhashed = []

    def running_hash(self) -> str:
        """A hash of every name in order, kept up to date as names are interned."""
        if self._unhashed:
            self._hash_added()
        return self._hash.hexdigest()

    def get(self, name: str) -> int:
        """The id of ``name`` or -1 when it was never interned."""
        return self.ids.get(name, -1)

    def state(self) -> list[str]:
        return list(self.names)

    def release(self, name: str) -> None:
        """Forget ``name``'s id (its job retired): :meth:`get` says -1, its slot in ``names``
        stays until :meth:`kept` drops it, and a later :meth:`intern` gives it a new id."""
        del self.ids[name]

    @classmethod
    def restore(cls, names: list[str], released: Any = ()) -> Interner:
        """The interner whose ``names`` are ``names`` (in order, the same running hash), the
        slots ``released`` (ids) among them released."""
        out = cls()
        out.names = list(names)
        gone = set(released)
        out.ids = {name: i for i, name in enumerate(out.names) if i not in gone}
        if out.names:
            out._unhashed = list(out.names)
        return out

    def kept(self, ids: Array) -> Interner:
        """A new interner of the names of ``ids`` (ascending, none released), renumbered
        0, 1, ... in that order: a compaction's."""
        return Interner.restore([self.names[i] for i in ids.tolist()])


class Table:
    """Named numpy columns of equal length ``capacity``; ``size`` rows are in use."""

    def __init__(self, columns: dict[str, tuple[Any, tuple[int, ...], int]], capacity: int = 64) -> None:
        """``columns`` maps a name to (dtype, extra dims, fill value)."""
        self.spec = columns
        self.size = 0
        self.capacity = capacity
        self.cols: dict[str, Array] = {
            name: np.full((capacity, *dims), fill, dtype=dtype)
            for name, (dtype, dims, fill) in columns.items()
        }

    def add(self, count: int = 1) -> int:
        """Reserve ``count`` new rows (filled with defaults); return the first row id."""
        first = self.size
        if first + count > self.capacity:
            self._grow(first + count)
        self.size += count
        return first

    def _grow(self, need: int) -> None:
        capacity = max(need, self.capacity * 2)
        for name, (dtype, dims, fill) in self.spec.items():
            grown = np.full((capacity, *dims), fill, dtype=dtype)
            grown[: self.size] = self.cols[name][: self.size]
            self.cols[name] = grown
        self.capacity = capacity

    def compact(self, keep: Array) -> None:
        """Keep the used rows where ``keep`` (a bool per used row) is set, in order, renumbered
        from 0; the capacity shrinks to twice the rows kept (at least 64)."""
        size = int(np.count_nonzero(keep))
        capacity = max(64, 2 * size)
        for name, (dtype, dims, fill) in self.spec.items():
            fresh = np.full((capacity, *dims), fill, dtype=dtype)
            fresh[:size] = self.cols[name][: self.size][keep]
            self.cols[name] = fresh
        self.size, self.capacity = size, capacity

    def view(self, name: str) -> Array:
        """The used rows of column ``name`` (a view: writes go to the table)."""
        return self.cols[name][: self.size]

    def nbytes(self) -> int:
        return sum(int(c.nbytes) for c in self.cols.values())

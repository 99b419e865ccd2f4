"""numba's on-disk cache, keyed on the source of the whole kernels package.

The hazard: ``numba.njit(cache=True)`` stamps each kernel's cache index with its own source file
only (numba 0.68: a hash of that file; before: its mtime and size), while a compiled kernel carries
compiled copies of every kernel it calls (``inline="always"`` ones at the IR level, the others
linked into its code library).  Edit a callee's module, or upgrade fleetlog where only a callee's
module changed, and every caller in another module would still load its cached code, running the
old callee: two machines would take different decisions from the same log.  numba does not track
these dependencies (its pull requests 8396 and 9563 tried and were closed unmerged);
``tests/core/test_kernel_cache.py`` shows the stale caller with plain ``cache=True``.

The guard: every kernel's cache stamp also holds a hash of every ``*.py`` file in its package's
folder (names and bytes, in sorted order), so any change anywhere in the package makes every
kernel of the package compile afresh once (a minute or two), and nothing stale ever loads.  It
reads source files only to decide whether numba may reuse compiled code: it can't change a
result.  It uses numba's ``FunctionCache`` and ``CompileResultCacheImpl`` (what
``cache=True`` installs) and keeps numba's choice of cache folder (``NUMBA_CACHE_DIR``,
``__pycache__`` or the user-wide one); only the stamp is extended.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, TypeVar

from numba.core.caching import CompileResultCacheImpl, FunctionCache
from numba.core.dispatcher import Dispatcher

_D = TypeVar("_D")


@functools.cache
def package_stamp(folder: Path) -> str:
    """sha256 over the names and bytes of the ``*.py`` files directly in ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class _PackageStamped:
    """numba's chosen locator, with the package's stamp added to the source file's."""

    def __init__(self, locator: Any, stamp: str) -> None:
        self._locator = locator
        self._stamp = stamp

    def ensure_cache_path(self) -> None:
        self._locator.ensure_cache_path()

    def get_cache_path(self) -> str:
        return str(self._locator.get_cache_path())

    def get_disambiguator(self) -> str:
        return str(self._locator.get_disambiguator())

    def get_source_stamp(self) -> tuple[object, str]:
        return self._locator.get_source_stamp(), self._stamp


class _PackageCacheImpl(CompileResultCacheImpl):
    def __init__(self, py_func: Any) -> None:
        super().__init__(py_func)  # type: ignore[no-untyped-call]
        folder = Path(py_func.__code__.co_filename).resolve().parent
        self._locator = _PackageStamped(self._locator, package_stamp(folder))


class PackageCache(FunctionCache):
    """``cache=True``'s cache, invalidated by a change to any module of the function's package."""

    _impl_class = _PackageCacheImpl


def package_cached(dispatcher: _D) -> _D:
    """Give a jitted function the package-keyed cache (a no-op under ``NUMBA_DISABLE_JIT``,
    where ``numba.njit`` returns the plain function)."""
    if isinstance(dispatcher, Dispatcher):
        jitted: Any = dispatcher
        jitted._cache = PackageCache(jitted.py_func)  # type: ignore[no-untyped-call]
    return dispatcher

"""numba's on-disk cache never serves a kernel compiled against an older callee.

Each run is a fresh process on one ``NUMBA_CACHE_DIR`` (kernels compiled in this process would
hide the cache), over a toy package laid out like ``fleetlog.core.kernels``: a caller module
calling a plain and an inlined kernel of a callee module.  With plain ``cache=True`` the caller's
cache outlives an edit of the callee's module (numba stamps it with the caller's file only); with
the kernels' own decorators (``base._jit``/``base._hot``, package-keyed: ``kernels/cache.py``)
the caller runs the new callee, and an unchanged package is still served from the cache.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import numba
import pytest
from numba.core.registry import CPUDispatcher

from fleetlog.core import kernels
from fleetlog.core.kernels.cache import PackageCache, package_stamp

ROOT = Path(__file__).resolve().parents[2]
JIT_OFF = bool(numba.config.DISABLE_JIT)  # type: ignore[attr-defined]

DECORATORS = {
    "guarded": "from fleetlog.core.kernels.base import _hot as hot, _jit as jit\n",
    "plain": (
        "import numba\n"
        "jit = numba.njit(cache=True)\n"
        "hot = numba.njit(cache=True, inline='always')\n"
    ),
}
CALLEE = (
    "{decorators}\n@jit\ndef plain(x):\n    return x + {add}\n\n"
    "@hot\ndef inlined(x):\n    return x * {times}\n"
)
CALLER = (
    "{decorators}\nfrom toy.callee import inlined, plain\n\n"
    "@jit\ndef both(x):\n    return plain(x) + inlined(x)\n"
)
RUN = (
    "import json\nfrom toy.caller import both\n"
    "value = both(1)\n"
    "print(json.dumps({'value': int(value), 'hits': sum(both.stats.cache_hits.values())}))\n"
)


def toy(folder: Path, decorators: str, add: int, times: int) -> None:
    package = folder / "toy"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "callee.py").write_text(CALLEE.format(decorators=decorators, add=add, times=times))
    (package / "caller.py").write_text(CALLER.format(decorators=decorators))


def run(folder: Path) -> dict[str, int]:
    """``both(1)`` in a fresh process, and how many of its signatures the cache served."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(folder / "cache"))
    env.pop("NUMBA_DISABLE_JIT", None)  # this is about compiled code
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-c", RUN], cwd=folder, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, int] = json.loads(done.stdout)
    return found


@pytest.mark.compiled  # ``run`` drops NUMBA_DISABLE_JIT: the plain-Python rerun would repeat it
@pytest.mark.parametrize(("decorators", "after_edit"), [("guarded", 3 + 100), ("plain", 1 + 1 + 10)])
def test_a_callers_cache_follows_an_edit_of_its_callees_module(
    tmp_path: Path, decorators: str, after_edit: int
) -> None:
    """Guarded: the caller runs the edited callee (3 + 100).  Plain ``cache=True``: the caller
    keeps running the old one (1 + 1 + 10), the hazard the guard is for, shown on today's numba."""
    toy(tmp_path, DECORATORS[decorators], add=1, times=10)
    assert run(tmp_path) == {"value": 12, "hits": 0}  # compiled, then cached
    assert run(tmp_path) == {"value": 12, "hits": 1}  # served from the cache
    toy(tmp_path, DECORATORS[decorators], add=2, times=100)  # only the callee's module changes
    assert run(tmp_path)["value"] == after_edit


def test_the_package_stamp_follows_every_module(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    first = package_stamp(tmp_path)
    package_stamp.cache_clear()
    assert package_stamp(tmp_path) == first  # same files, same stamp
    for change in (lambda: (tmp_path / "b.py").write_text("y = 2\n"),
                   lambda: (tmp_path / "c.py").write_text(""),
                   lambda: (tmp_path / "a.py").rename(tmp_path / "d.py")):
        change()
        package_stamp.cache_clear()
        assert package_stamp(tmp_path) != first
        first = package_stamp(tmp_path)


def test_every_kernel_has_the_package_keyed_cache() -> None:
    """A kernel decorated some other way (``numba.njit(cache=True)``) would bring the hazard back."""
    names = [f"{kernels.__name__}.{i.name}" for i in pkgutil.iter_modules(kernels.__path__)]
    modules = [importlib.import_module(name) for name in names]
    found = [f for m in modules for f in vars(m).values()
             if isinstance(f, CPUDispatcher) and f.py_func.__module__ == m.__name__]
    assert JIT_OFF or len(found) > 50
    assert [f.py_func.__name__ for f in found if not isinstance(f._cache, PackageCache)] == []

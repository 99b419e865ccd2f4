"""The install is quiet: ``project.license`` is an SPDX expression with its license file
(PEP 639), and the build backend is a setuptools that takes it — no deprecation banner."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def test_the_license_is_an_spdx_expression_with_its_file_and_a_setuptools_that_takes_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    files = project["project"]["license-files"]
    assert files == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    (backend,) = [Requirement(r) for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert not backend.specifier.contains("77.0.2")  # 77.0.3 is the first that takes both fields
    assert backend.specifier.contains("77.0.3")
    assert backend.specifier.contains(str(Version("84.2.1")))


def test_pip_installs_it_without_a_warning_from_the_build_backend() -> None:
    """A real pip run (build isolation: the setuptools that build-system asks for, from PyPI)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "-e", str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Would install fleetlog" in output
    for banner in ("BuildBackendWarning", "deprecated", "SetuptoolsDeprecationWarning", "!!"):
        assert banner not in output, output

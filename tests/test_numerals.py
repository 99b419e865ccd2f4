"""fleetlog.numerals (issue 46): numbers from clients and files are ASCII digits only."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleetlog.backends.slurm.mapping import gpu_gres, parse_name
from fleetlog.history_cli import _positive as history_positive
from fleetlog.log.file import SEGMENT_SUFFIX, _list_segments
from fleetlog.numerals import whole
from fleetlog.reads_cli import _positive as reads_positive
from fleetlog.simulation.clusters import load_cluster
from fleetlog.simulation.spec import SpecError


@pytest.mark.parametrize("text", ["²", "١", "٣", "０", "߁", "-1", "+1", " 1", "1 ", "1e3", "0x10", "", "1_0"])
def test_anything_but_ascii_digits_is_no_number(text: str) -> None:
    """``²``, ``١``, ``٣``, ``０`` and ``߁`` pass ``str.isdigit()``; ``int()`` takes all but ``²``."""
    assert whole(text) is None


def test_ascii_digits_are_the_number_they_spell_within_the_digits_allowed() -> None:
    assert whole("0") == 0
    assert whole("0042") == 42
    assert whole("9" * 18, 18) == 10**18 - 1
    assert whole("9" * 19, 18) is None


def test_the_parsers_that_took_str_isdigit_refuse_other_digits_without_raising(tmp_path: Path) -> None:
    """Each former ``isdigit()`` site: a Slurm job name or GRES with ``²`` is not fleetlog's / no
    GPU (the backend does not crash on a user's job), a segment file named in other digits is no
    segment, a cluster shape ``²x8xA100`` is a SpecError, a CLI count ``١`` a usage error."""
    assert parse_name("fleetlog", "fleetlog:²:0:job-1") is None
    assert parse_name("fleetlog", "fleetlog:1:0:job-1") is not None
    assert gpu_gres("gpu:a100:²,gpu:a100:2") == (2, "a100")
    (tmp_path / ("٣" * 20 + SEGMENT_SUFFIX)).touch()
    (tmp_path / (f"{7:020d}" + SEGMENT_SUFFIX)).touch()
    assert _list_segments(tmp_path) == [7]
    with pytest.raises(SpecError):
        load_cluster("²x8xA100")
    for positive in (history_positive, reads_positive):
        with pytest.raises(argparse.ArgumentTypeError):
            positive("١")
        assert positive("3") == 3

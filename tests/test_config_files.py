"""Files a command reads: what is not a regular file is named as such, not as missing."""

from __future__ import annotations

import os

import pytest

from twinfer.config import read_mapping
from twinfer.errors import TwinferError


def test_a_device_or_pipe_is_not_a_regular_file_not_a_missing_one(tmp_path):
    with pytest.raises(TwinferError, match="/dev/null: not a regular file"):
        read_mapping("/dev/null")
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)   # reading it would block: refused before it is opened
    with pytest.raises(TwinferError, match="not a regular file"):
        read_mapping(fifo)
    with pytest.raises(TwinferError, match="a directory, not a file"):
        read_mapping(tmp_path)
    with pytest.raises(TwinferError, match="no such file"):
        read_mapping(tmp_path / "missing.yaml")


def test_run_and_bench_name_a_workload_that_is_not_a_regular_file():
    from typer.testing import CliRunner

    from ui.cli import app

    r = CliRunner().invoke(app, ["run", "-m", "tiny", "-w", "/dev/null", "--load-format", "dummy"])
    assert isinstance(r.exception, TwinferError) and "/dev/null: not a regular file" in str(r.exception), r.output
    r = CliRunner().invoke(app, ["simulate", "-s", "/dev/null"])
    assert isinstance(r.exception, TwinferError) and "/dev/null: not a regular file" in str(r.exception), r.output


def test_a_hardware_path_that_is_not_a_regular_file_is_named_as_such(tmp_path):
    """`--hw /dev/null` read "unknown hardware '/dev/null'" and listed the catalog."""
    from costmodels.hardware import get_hardware

    with pytest.raises(TwinferError, match="/dev/null: not a regular file"):
        get_hardware("/dev/null")
    with pytest.raises(TwinferError, match="a directory, not a file"):
        get_hardware(str(tmp_path))
    with pytest.raises(TwinferError, match="unknown hardware 'nosuch'"):
        get_hardware("nosuch")

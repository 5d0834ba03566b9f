"""The prepared device script (bench/device_check.py) runs here against the pynvml fakes, so
it cannot rot before a GPU machine is lent; the CUDA part needs a real driver."""

from __future__ import annotations

import ctypes
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import REPO
from .fake_nvml import FakeNvml


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "device_check", REPO / "bench" / "device_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_libcuda(), reason="a real CUDA driver is here: run the script itself")
def test_reports_the_devices_and_says_what_it_could_not_check(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    rc = _load().main(["--out", str(tmp_path)])
    results = json.loads((tmp_path / "device-check.json").read_text())
    names = [g["name"] for g in results["nvml"]["gpus"]]
    assert results["nvml"]["status"] == "ok" and names == [d.name for d in fake_nvml.devices]
    checks = {c["check"]: c for c in results["checks"]}
    assert checks["NVML read"]["ok"]
    assert not checks["libcuda available"]["ok"]  # no driver: the CUDA checks cannot run
    assert rc == 1
    report = (tmp_path / "device-check.md").read_text()
    assert all(name in report for name in names) and "| libcuda available | NO |" in report

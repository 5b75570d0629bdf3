"""The cuda target's pure parts, no GPU and no driver: launch rules and their kernel headers, and NVML's readings
decoded into telemetry."""
from __future__ import annotations

import importlib

import pytest

from kfactory.targets.cuda import nvml
from kfactory.targets.cuda import launch
from kfactory.v1 import events_pb2 as pb


# -- launch rules ------------------------------------------------------------------------------------------

def test_launch_rule_ints_tuples_cdiv_and_params():
    shape = {"rows": 1000, "cols": 4099}
    want = launch.Launch((250, 1, 1), (128, 1, 1), 0)
    assert launch.evaluate_launch({"grid": "cdiv(rows, 4)", "block": "128"}, shape) == want
    got = launch.evaluate_launch({"grid": "(cdiv(cols, BX), rows)", "block": "(BX, 2)", "smem": "BX * 4 * 2",
                                  "params": {"BX": 256}}, shape)
    assert got == launch.Launch((17, 1000, 1), (256, 2, 1), 2048)
    assert got.as_json() == {"grid": [17, 1000, 1], "block": [256, 2, 1], "smem": 2048}
    assert got.threads == 512
    assert launch.evaluate_launch({"grid": [2, 3], "block": 64}, shape).grid == (2, 3, 1)  # literals from YAML
    assert launch.evaluate_launch({"grid": "max(1, min(rows, 8))", "block": "abs(-32)", "smem": ""}, shape).smem == 0
    fam = {"grid": "cdiv(rows, block // 32) if mapping == 'warp' else rows", "block": "block"}
    assert launch.evaluate_launch({**fam, "params": {"block": 256, "mapping": "warp"}}, shape).grid == (125, 1, 1)
    assert launch.evaluate_launch({**fam, "params": {"block": 256, "mapping": "block"}}, shape).grid == (1000, 1, 1)


@pytest.mark.parametrize("rule, message", [
    ({"grid": "rows / 3", "block": "128"}, "not an integer"),
    ({"grid": "1", "block": "2048"}, "block.x=2048"),
    ({"grid": "1", "block": "(32, 32, 2)"}, "2048 threads per block"),
    ({"grid": "1", "block": "(1, 1, 65)"}, "block.z=65"),
    ({"grid": "(1, 65536)", "block": "1"}, "grid.y=65536"),
    ({"grid": "2 ** 31", "block": "1"}, "grid.x"),
    ({"grid": "0", "block": "1"}, "grid.x=0"),
    ({"grid": "(1, 2, 3, 4)", "block": "1"}, "1 to 3 ints"),
    ({"grid": "1", "block": "1", "smem": "-4"}, "must be >= 0"),
    ({"grid": "1", "block": "1", "smem": "1.5"}, "not an integer"),
    ({"grid": "nope", "block": "1"}, "cannot be evaluated"),
    ({"grid": "cdiv(rows, 0)", "block": "1"}, "cannot be evaluated"),
    ({"grid": "True", "block": "1"}, "not an integer"),
    ({"block": "1"}, "has no grid"),
    ("grid=1", "must be a dict"),
])
def test_bad_launch_rules_are_refused_with_a_reason(rule, message):
    with pytest.raises(ValueError, match=message):
        launch.evaluate_launch(rule, {"rows": 10})


def test_header_parsing():
    src = "#include <x.h>\n// kfactory: grid=(cdiv(cols, 256), rows) block=256 smem = 1024\n__global__ void k() {}"
    assert launch.parse_header(src) == {"grid": "(cdiv(cols, 256), rows)", "block": "256", "smem": "1024", "params": {}}
    assert launch.parse_header("/* kfactory: grid=rows block=(32, 4) */\n") == {
        "grid": "rows", "block": "(32, 4)", "smem": "0", "params": {}}
    ptx = ".version 8.0\n// kfactory: grid=cdiv(rows, 4) block=128\n.target sm_90a\n"
    rule = launch.parse_header(ptx)
    assert launch.evaluate_launch(rule, {"rows": 9}) == launch.Launch((3, 1, 1), (128, 1, 1), 0)
    assert launch.parse_header("__global__ void k() {}  // no header") is None
    for bad, msg in [("// kfactory: grid=1", "missing block"), ("// kfactory: grid=1 block=2 warps=4", "unknown"),
                     ("// kfactory: grid=(1 block=2", "unbalanced"), ("// kfactory: grid=1 grid=2 block=1", "twice"),
                     ("// kfactory: 42", "name=value")]:
        with pytest.raises(ValueError, match=msg):
            launch.parse_header(bad)


# -- NVML decoding -----------------------------------------------------------------------------------------

def test_throttle_names_and_what_counts_as_throttled():
    assert nvml.throttle_names(0x1) == []  # idle is not a reason worth naming
    assert nvml.throttle_names(0x4 | 0x40 | 0x1) == ["SwPowerCap", "HwThermalSlowdown"]
    assert nvml.throttle_names(0x10 | 0x100000) == ["SyncBoost", "0x100000"]
    assert not nvml.is_throttled(0x1 | 0x2 | 0x10 | 0x100)
    for bit in (0x4, 0x8, 0x20, 0x40, 0x80):
        assert nvml.is_throttled(bit)


def test_telemetry_from_literal_readings():
    before = {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 41, "power_w": 120.5, "reasons": 0x1}
    after = {"sm_clock_mhz": 1755, "mem_clock_mhz": 2619, "temperature_c": 63, "power_w": 690.0, "reasons": 0x4}
    t = nvml.telemetry(before, after, "NVIDIA H200", "GPU-1234")
    assert isinstance(t, pb.GpuTelemetry)
    assert (t.model, t.uuid, t.sm_clock_mhz_before, t.sm_clock_mhz_after) == ("NVIDIA H200", "GPU-1234", 1980, 1755)
    assert (t.mem_clock_mhz_before, t.mem_clock_mhz_after, t.temperature_c) == (2619, 2619, 63)
    assert t.power_w == pytest.approx(690.0)
    assert list(t.throttle_reasons) == ["SwPowerCap"] and t.throttled and t.retries == 0
    calm = nvml.telemetry({"reasons": 0x1}, {"reasons": 0x1}, "m", "u")
    assert not calm.throttled and list(calm.throttle_reasons) == []
    empty = nvml.telemetry({}, {}, "m", "u")  # no NVML: zeros, not an error
    assert empty.sm_clock_mhz_before == 0 and not empty.throttled


def test_nvml_without_a_gpu_reads_empty_and_resolving_says_why(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    monkeypatch.setattr(nvml, "_started", False)
    assert nvml.read("GPU-0") == {}
    with pytest.raises(nvml.NvmlUnavailable, match="not installed"):
        nvml.resolve_gpu("")


def test_module_reload_is_clean():
    # these tests reach the module's names through the module, so a reload (this test) changes none of them
    importlib.reload(launch)

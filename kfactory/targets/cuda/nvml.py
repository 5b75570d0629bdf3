"""GPU telemetry through NVML (nvidia-ml-py): clocks, temperature, power and clock-event (throttle) reasons.

Imports without a GPU and without nvidia-ml-py. Then `resolve_gpu` raises NvmlUnavailable (a clear message:
no GPU can be picked), while `read` returns an empty reading {} and `telemetry` builds a message of zeros:
telemetry is an observation around a measurement, and its absence must not fail the measurement.

Which clock-event reasons count as "throttled" (the clocks were lowered by something that can come and go
during a measurement, so its times are not comparable with another one's):
- SwPowerCap (0x4), HwSlowdown (0x8), SwThermalSlowdown (0x20), HwThermalSlowdown (0x40),
  HwPowerBrakeSlowdown (0x80): power or thermal limits acting now. Throttled.
- GpuIdle (0x1): the GPU had no work when it was read (the reads are taken just before and after a
  measurement); not a slowdown. Left out of the names too.
- ApplicationsClocksSetting (0x2), DisplayClockSetting (0x100): clocks fixed by configuration; steady,
  not throttled (we never change clocks ourselves).
- SyncBoost (0x10): clocks held to the slowest GPU of a sync-boost group; a steady configuration, not a
  transient, so named but not throttled.
- BoardLimit (0x200), Reliability (0x400) (newer drivers): static limits of the board; named, not throttled.
"""
from __future__ import annotations

import threading

from kfactory.v1 import events_pb2 as pb

try:  # nvidia-ml-py
    import pynvml
except ImportError:  # pragma: no cover - exercised where nvidia-ml-py is absent
    pynvml = None

#: bit -> name, as in nvml.h (nvmlClocksEventReason*; the older name was nvmlClocksThrottleReason*)
REASONS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}
IDLE = 0x1
#: the reasons that slow the clocks transiently (see the module docstring)
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

_lock = threading.Lock()
_started = False


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: nvidia-ml-py is missing, or there is no NVIDIA driver or GPU."""


def _init() -> None:
    global _started
    if pynvml is None:
        raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed; no GPU can be used")
    with _lock:
        if _started:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot start (no NVIDIA driver or GPU here?): {e}") from e
        _started = True


def _handle(gpu: str):
    """An NVML handle for a GPU UUID ('GPU-...', 'MIG-...') or an index ('0')."""
    _init()
    try:
        if gpu.strip().isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(gpu))
        return pynvml.nvmlDeviceGetHandleByUUID(gpu.strip())
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"no GPU {gpu!r}: {e}") from e


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def resolve_gpu(spec: str = "") -> tuple[str, str]:
    """(uuid, model name) of the GPU named by `spec` (a UUID or an index; '' is GPU 0)."""
    h = _handle(spec or "0")
    try:
        return _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h))
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"cannot read GPU {spec or '0'}: {e}") from e


def _reasons(h) -> int:
    fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is not None:
        try:
            return int(fn(h))
        except pynvml.NVMLError:
            pass
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def read(uuid: str) -> dict:
    """One reading of a GPU: {"sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "reasons"}
    (reasons: the clock-event bitmask). A figure NVML does not give is left out; {} without NVML."""
    try:
        h = _handle(uuid)
    except NvmlUnavailable:
        return {}
    out: dict = {}
    reads = {
        "sm_clock_mhz": lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        "mem_clock_mhz": lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
        "temperature_c": lambda: int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # milliwatts
        "reasons": lambda: _reasons(h),
    }
    for name, fn in reads.items():
        try:
            out[name] = fn()
        except pynvml.NVMLError:
            continue
    return out


def throttle_names(mask: int) -> list[str]:
    """Names of the clock-event reasons set in `mask`, GpuIdle left out; unknown bits as hex."""
    names = []
    for bit in range(0, 64):
        b = 1 << bit
        if mask & b and b != IDLE:
            names.append(REASONS.get(b, f"0x{b:x}"))
    return names


def is_throttled(mask: int) -> bool:
    """True when a reason that slows the clocks transiently is set (power or thermal slowdowns)."""
    return bool(mask & THROTTLING)


def telemetry(before: dict, after: dict, model: str, uuid: str) -> pb.GpuTelemetry:
    """The telemetry of one measurement from the readings just before and just after it: clocks both
    times, the temperature and power after (the warmer end), the reasons seen in either reading."""
    mask = int(before.get("reasons", 0)) | int(after.get("reasons", 0))
    return pb.GpuTelemetry(
        model=model, uuid=uuid,
        sm_clock_mhz_before=int(before.get("sm_clock_mhz", 0)), sm_clock_mhz_after=int(after.get("sm_clock_mhz", 0)),
        mem_clock_mhz_before=int(before.get("mem_clock_mhz", 0)),
        mem_clock_mhz_after=int(after.get("mem_clock_mhz", 0)),
        temperature_c=int(after.get("temperature_c", before.get("temperature_c", 0))),
        power_w=float(after.get("power_w", before.get("power_w", 0.0))),
        throttle_reasons=throttle_names(mask), throttled=is_throttled(mask))

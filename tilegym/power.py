"""How long the GPU ran below its clocks because of its power limit, read from NVML (NVIDIA only).

A compute-bound kernel timed back to back can push the board over its power limit; the driver
then lowers the SM clock for a while, and the same kernel takes longer. The benchmark reads
NVML's power-violation counter before and after each timing, so every row says what share of
its timed window ran power-capped. NVML is the driver's ``libnvidia-ml.so.1``, opened with
ctypes on first use (no package needed); where it is missing every reading is ``None``.
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass

import torch

NVML_SUCCESS = 0
NVML_PERF_POLICY_POWER = 0  # nvmlPerfPolicyType_t: time spent below application clocks by the power limit


class _ViolationTime(ctypes.Structure):
    _fields_ = [("reference_time", ctypes.c_ulonglong), ("violation_time", ctypes.c_ulonglong)]


@functools.cache
def _nvml() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    init = getattr(lib, "nvmlInit_v2", None)
    return lib if init is not None and init() == NVML_SUCCESS else None


@functools.cache
def _handle(device_index: int) -> ctypes.c_void_p | None:
    """NVML's handle of the CUDA device ``device_index``, matched by UUID, else by PCI address
    (CUDA and NVML number GPUs differently)."""
    lib = _nvml()
    if lib is None:
        return None
    props = torch.cuda.get_device_properties(device_index)
    lookups = []
    if getattr(props, "uuid", None) is not None:
        lookups.append(("nvmlDeviceGetHandleByUUID", f"GPU-{props.uuid}"))
    if getattr(props, "pci_bus_id", None) is not None:
        address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        lookups.append(("nvmlDeviceGetHandleByPciBusId_v2", address))
    handle = ctypes.c_void_p()
    for name, key in lookups:
        lookup = getattr(lib, name, None)  # an older driver's NVML may lack a symbol
        if lookup is not None and lookup(key.encode(), ctypes.byref(handle)) == NVML_SUCCESS:
            return handle
    return None


def _power_violation_ns(handle: ctypes.c_void_p) -> int | None:
    status = _ViolationTime()
    query = getattr(_nvml(), "nvmlDeviceGetViolationStatus", None)
    if query is None or query(handle, NVML_PERF_POLICY_POWER, ctypes.byref(status)) != NVML_SUCCESS:
        return None
    return int(status.violation_time)


@dataclass(frozen=True)
class PowerReading:
    """NVML's cumulative power-capped time and a wall clock, both in nanoseconds."""

    capped_ns: int
    wall_ns: int


def read_power(device: torch.device) -> PowerReading | None:
    """The power-capped time so far on ``device``; ``None`` off NVIDIA or without NVML."""
    if device.type != "cuda" or torch.version.hip:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = _handle(index)
    capped = None if handle is None else _power_violation_ns(handle)
    return None if capped is None else PowerReading(capped, time.monotonic_ns())


def capped_percent(before: PowerReading | None, after: PowerReading | None) -> float | None:
    """Share of the wall time between two readings that the GPU ran power-capped, in percent."""
    if before is None or after is None or after.wall_ns <= before.wall_ns:
        return None
    share = (after.capped_ns - before.capped_ns) / (after.wall_ns - before.wall_ns)
    return 100.0 * min(max(share, 0.0), 1.0)

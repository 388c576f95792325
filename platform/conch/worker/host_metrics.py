"""The worker's host: CPU and GPU use, for Triton's ``nv_cpu_*`` and ``nv_gpu_*`` families.

A worker samples its host at each heartbeat and sends the sample in its report
(``conch.wire.worker_reports``); gateways print the freshest sample per host (CPU) or
per GPU (by UUID), so two workers on one host do not double it. CPU figures come from
``/proc`` (Linux); GPU figures from NVIDIA's NVML bindings (``nvidia-ml-py``, the ``gpu``
extra), only where they import and NVML finds a device: elsewhere there are none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROC = Path("/proc")


def _cpu_times(proc: Path) -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot, from ``/proc/stat``'s cpu line."""
    fields = [int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user and nice
    return total - idle, total


def _memory(proc: Path) -> tuple[int, int]:
    """(total, used) bytes; used is what is not available (``MemAvailable``), as ``free``."""
    info: dict[str, int] = {}
    for line in (proc / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        info[name] = int(rest.split()[0]) * 1024
    total = info["MemTotal"]
    return total, total - info.get("MemAvailable", info.get("MemFree", 0))


class CpuSampler:
    """CPU use between two samples (0..1, all cores), and memory now."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self._last = _cpu_times(proc)

    def sample(self) -> dict[str, float]:
        busy, total = _cpu_times(self.proc)
        last_busy, last_total = self._last
        self._last = busy, total
        used = (busy - last_busy) / (total - last_total) if total > last_total else 0.0
        mem_total, mem_used = _memory(self.proc)
        return {
            "utilization": max(0.0, min(1.0, used)),
            "memory_total_bytes": mem_total,
            "memory_used_bytes": mem_used,
        }


class GpuSampler:
    """Each NVIDIA GPU NVML sees: utilization (0..1), memory, power (W) and energy (J)."""

    def __init__(self) -> None:
        import pynvml  # the gpu extra; ImportError when absent

        self.nvml = pynvml
        pynvml.nvmlInit()  # NVMLError when there is no driver
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    def sample(self) -> list[dict[str, Any]]:
        nv = self.nvml
        out = []
        for handle in self.handles:
            uuid = nv.nvmlDeviceGetUUID(handle)
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            gpu: dict[str, Any] = {
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "utilization": nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
                "memory_total_bytes": memory.total,
                "memory_used_bytes": memory.used,
            }
            for key, read, scale in (
                ("power_usage", nv.nvmlDeviceGetPowerUsage, 1e-3),  # mW -> W
                ("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, 1e-3),
                ("energy_consumption", nv.nvmlDeviceGetTotalEnergyConsumption, 1e-3),  # mJ -> J
            ):
                with contextlib.suppress(nv.NVMLError):  # not every board reports power
                    gpu[key] = read(handle) * scale
            out.append(gpu)
        return out

    def process_memory(self) -> dict[int, int]:
        """GPU memory each process uses, by pid, summed over this host's GPUs (NVML's
        compute processes; a board that keeps the number to itself gives none)."""
        nv = self.nvml
        used: dict[int, int] = {}
        for handle in self.handles:
            with contextlib.suppress(nv.NVMLError):
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                    if isinstance(proc.usedGpuMemory, int):
                        used[proc.pid] = used.get(proc.pid, 0) + proc.usedGpuMemory
        return used


def resident_bytes(pid: int, proc: Path = PROC) -> int | None:
    """Process ``pid``'s resident memory (``statm``), or None once it is gone."""
    try:
        pages = int((proc / str(pid) / "statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def gpu_sampler() -> GpuSampler | None:
    """NVML's view of this host's GPUs; None where NVML or a GPU cannot be had."""
    try:
        sampler = GpuSampler()
    except ImportError:
        log.info("GPU metrics off: nvidia-ml-py is not installed (the gpu extra)")
        return None
    except Exception as exc:  # NVMLError: no driver, no device
        log.info("GPU metrics off: NVML is not available (%s)", exc)
        return None
    return sampler if sampler.handles else None


class HostMetrics:
    """What a worker's report carries about its host (``sample``), per the settings: a
    new sample at most every ``interval_s`` (Triton's ``--metrics-interval-ms``), so CPU
    use is measured over at least that long; reports in between repeat the last one."""

    def __init__(self, *, cpu: bool, gpu: bool, interval_s: float = 2.0) -> None:
        self.host = socket.gethostname()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self.cpu = _cpu_sampler() if cpu else None
        self.gpu = gpu_sampler() if gpu else None
        self._last: dict[str, Any] = {"host": self.host}
        self._at = float("-inf")

    def sample(self) -> dict[str, Any]:
        """{"host", "cpu"?, "gpus"?}: only the parts that are on and readable."""
        with self._lock:  # the heartbeat and a model change may report at once
            if time.monotonic() - self._at >= self.interval_s:
                self._last, self._at = self._read(), time.monotonic()
            return self._last

    def gpu_memory(self) -> dict[int, int]:
        """GPU memory by pid (empty where GPU metrics are off or unreadable)."""
        if self.gpu is None:
            return {}
        try:
            return self.gpu.process_memory()
        except Exception as exc:
            log.warning("GPU memory of processes not read: %s", exc)
            return {}

    def _read(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host}
        if self.cpu is not None:
            out["cpu"] = self.cpu.sample()
        if self.gpu is not None:
            try:
                out["gpus"] = self.gpu.sample()
            except Exception as exc:
                log.warning("GPU metrics not read: %s", exc)
        return out


def _cpu_sampler() -> CpuSampler | None:
    try:
        return CpuSampler()
    except (OSError, ValueError, IndexError) as exc:
        log.info("CPU metrics off: %s is not readable (%s)", PROC, exc)
        return None

"""A stand-in for ``triton_shm_monitor``, the compiled module Triton's Python backend build
leaves in qa/common for ``shm_util.ShmLeakDetector``.

The detector watches the Python backend's shared-memory regions
(``/dev/shm/triton_python_backend_shm_region*``) for bytes not given back. conch's Python
backend makes no such regions, so there is nothing to watch: the detector needs the
module to import, and a region of that name (another program's) reads as unchanged.
The runner puts this folder on the cases' ``PYTHONPATH``.
"""


class SharedMemoryManager:
    def __init__(self, name: str) -> None:
        self.name = name

    def free_memory(self) -> int:
        return 0

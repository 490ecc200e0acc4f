"""Device and backend choice, and memory measurement, in one place (device-agnostic runtime).

"cuda" + "nccl" when CUDA is present, else "cpu" + "gloo"; ``--backend`` overrides the backend.
Peak memory on GPU is ``torch.cuda.max_memory_allocated``. CPU has no allocator statistics in torch, so
on CPU we read glibc's ``mallinfo2()`` (heap bytes in use: uordblks + hblkhd) via ctypes -- it matches
tensor bytes closely (runtime-notes §6) -- sampled by ``MemoryMeter.sample()`` at the points where
activations peak (the end of each block's forward) and at step end; the peak is the max of the samples,
a slight under-estimate of the true high-water mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

GIB = 1024 ** 3


def pick_device(backend: str | None, local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) for this rank."""
    if torch.cuda.is_available() and backend != "gloo":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), backend or "nccl"
    return torch.device("cpu"), backend or "gloo"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _load_mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _load_mallinfo2()


def heap_in_use_bytes() -> int:
    """glibc heap bytes in use by this process (0 where mallinfo2 is unavailable)."""
    if _MALLINFO2 is None:
        return 0
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


class MemoryMeter:
    """Peak memory of one training step on this rank, in bytes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes = 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_bytes = heap_in_use_bytes() if self.device.type == "cpu" else 0

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def peak_reserved(self) -> int:
        """CUDA: the caching allocator's reserved peak since ``reset`` (what nvidia-smi and torchtitan show)."""
        return int(torch.cuda.max_memory_reserved(self.device)) if self.on_cuda else 0

    def sample(self) -> None:
        if self.device.type == "cpu":
            self.peak_bytes = max(self.peak_bytes, heap_in_use_bytes())

    def peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        self.sample()
        return self.peak_bytes

    def hook(self, *_args) -> None:
        """A forward hook (module, input, output) that samples."""
        self.sample()


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16/fp16 autocast on GPU when the plan asks for it; CPU runs fp32 (plans for cpu-local use fp32).
    Any other precision (fp8 is planner-only) is an error, never a silent fp16: runtime/validate.py refuses
    such plans before this is reached."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision {precision!r}: the runtime executes fp32, bf16 and fp16 only")
    if device.type != "cuda" or precision == "fp32":
        return None
    return torch.bfloat16 if precision == "bf16" else torch.float16

"""For tests that need a machine without an NVIDIA driver (the development machines)."""

from __future__ import annotations

import pytest


def skip_if_nvidia_driver() -> None:
    """Skip the calling test where NVML answers: a real driver changes what it checks."""
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip("this machine has an NVIDIA driver")

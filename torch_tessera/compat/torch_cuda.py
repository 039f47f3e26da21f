"""``torch.cuda`` internals torch_tessera's measurements use, in one place.

Checked on torch 2.13.0 (CPU build: the function exists, it needs a GPU to run) and written against torch 2.11.0
(the GPU machine's version), where ``torch.cuda._sleep(cycles)`` has the same signature.
"""

from __future__ import annotations

import torch

#: GPU clock cycles per second assumed when turning seconds into a spin (an H200's boost clock, datasheet); a lower
#: clock only makes the spin longer
SPIN_CLOCK_HZ = 1.98e9


def spin(seconds: float) -> bool:
    """Queue a kernel on the current CUDA stream that keeps it busy for about ``seconds``, so the host can queue the
    work behind it before the GPU reaches it (timings then measure the GPU, not the host's issue rate).

    Returns:
        False where this torch has no ``torch.cuda._sleep`` (nothing queued: the caller's timings may include the
        host's issue gaps).
    """
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return False
    sleep(max(1, int(seconds * SPIN_CLOCK_HZ)))
    return True

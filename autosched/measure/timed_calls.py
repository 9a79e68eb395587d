"""How the check worker times a loaded IREE function: repetitions of at least a minimum time
each, and how often one call of IREE's dispatch benchmark may dispatch."""

from __future__ import annotations

import math
import time

MAX_CALL_S = 0.5  # a dispatch benchmark's call longer than this dispatches less often
FITTED_CALL_S = 0.05  # ... about this much work a call, as the targets' dispatch_repeat aims
# A call this long is one sample: its own length averages out what more repetitions would.
# IREE's attention at ViT-B/16's 197 tokens (18.5 ms a dispatch, 200 to a call of the bare
# kernel's module) took 11 s to time in three repetitions on the H100.
LONG_CALL_S = 1.0


def fitted_count(function, count: int) -> int:
    """How often one call of a dispatch benchmark dispatches: `count`, as the target chose
    it from the problem's work, unless that makes a call longer than MAX_CALL_S. IREE's
    default for resnet50's strided 1x1 convolutions is so slow (over 0.14 s a dispatch on
    the H200) that 200 dispatches a call timed out after 120 s, and the problem, the
    model's largest, lost its default. Two calls of one dispatch say how long one takes
    (the first also loads the kernel)."""
    for _ in range(2):
        started = time.perf_counter()
        function(1)
        seconds = time.perf_counter() - started
    if seconds * count <= MAX_CALL_S:
        return count
    return max(1, min(count, math.ceil(FITTED_CALL_S / seconds)))


def time_calls(
    function,
    arguments: list,
    repetitions: int,
    min_time: float,
    warm: bool = False,
    slow_ms: float | None = None,
) -> list[float]:
    """Milliseconds per call, one sample per repetition of at least `min_time` seconds.

    The function is IREE's synchronous export, which returns once its work on the device is
    done. A warm-up of `min_time` comes first unless the module has just run (`warm`: the
    check that precedes a timing already loaded it and ran it on these inputs). A call
    slower than `slow_ms` in its first repetition is a candidate that cannot win: it keeps
    that one sample, since more repetitions would only sharpen a loser's time; so does a
    call of LONG_CALL_S or more.
    """
    if not warm:
        started = time.perf_counter()
        while True:
            function(*arguments)
            if time.perf_counter() - started >= min_time:
                break
    samples = []
    for _ in range(repetitions):
        calls, started = 0, time.perf_counter()
        while True:
            function(*arguments)
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= min_time:
                break
        samples.append(elapsed * 1e3 / calls)
        if (slow_ms is not None and samples[0] > slow_ms) or elapsed / calls >= LONG_CALL_S:
            break
    return samples

"""Samplers for every component, one module each: host, NVML, DCGM, and the chooser.

A sampler's ``sample(ts_ns)`` returns store rows (hpcml.observe.store). GPU samplers are
chosen by name (``hpcml.samplers.choose.SAMPLERS``); a site package adds one through the
``hpcml.samplers`` entry-point group: a function ``(gpus, interval, env) -> (sampler, label)``
that raises ``SamplerUnavailable`` when it cannot be used.
"""


from hpcml.errors import UsageError

#: why a task recorded no GPU samples (the ``reason`` of its ``gpu_sampler`` label)
OFF, NONE_VISIBLE, CLAIMED, UNAVAILABLE = "off", "none_visible", "claimed_by_another_task", "unavailable"


class SamplerUnavailable(Exception):
    """A GPU sampler cannot be used here (no driver, no host engine); the message says why."""


class NoGpuSamples(UsageError):
    """A job directory without GPU samples; ``reasons``: each rank's recorded reason
    (``NONE_VISIBLE``, ...), for callers that word it their way without parsing the text."""

    def __init__(self, message: str, *, reasons: frozenset[str] = frozenset(), file: str | None = None) -> None:
        super().__init__(message, file=file)
        self.reasons = reasons

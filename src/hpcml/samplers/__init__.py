"""Samplers for every component, one module each: host, NVML, DCGM, and the chooser.

A sampler's ``sample(ts_ns)`` returns store rows (hpcml.observe.store). GPU samplers are
chosen by name (``hpcml.samplers.choose.SAMPLERS``); a site package adds one through the
``hpcml.samplers`` entry-point group: a function ``(gpus, interval, env) -> (sampler, label)``
that raises ``SamplerUnavailable`` when it cannot be used.
"""


class SamplerUnavailable(Exception):
    """A GPU sampler cannot be used here (no driver, no host engine); the message says why."""

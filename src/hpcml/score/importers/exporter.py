"""dcgm-exporter ``/metrics`` scrapes saved one after another (e.g. ``while sleep 1; do
curl -s node:9400/metrics; done > scrapes.prom``), parsed with prometheus-client's text
parser. A scrape ends where a series repeats; a sample's own timestamp (milliseconds,
optional in the exposition format) is used when present, else scrape index x interval.
"""

from __future__ import annotations

import math
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID
from hpcml.samplers.fields import DCGM_NAMES as NAMES
from hpcml.score.recording import Recording


def load(path: str | Path, interval: float = 1.0) -> Recording:
    from prometheus_client.parser import text_string_to_metric_families
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read a dcgm-exporter scrape file: {exc}", file=str(p)) from None
    rec = Recording(source=f"dcgm-exporter:{p}")
    scrape = 0
    seen: set[tuple[str, str, int]] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"not Prometheus exposition text: {exc}", file=str(p)) from None
    for family in families:
        for sample in family.samples:
            fid = NAMES.get(sample.name)
            if fid is None:
                continue
            labels = sample.labels
            gpu = labels.get("gpu")
            if gpu is None:
                raise UsageError(f"{sample.name} has no gpu label", file=str(p))
            node = labels.get("Hostname") or labels.get("hostname") or "node"
            key = (node, gpu, fid)
            if key in seen:                 # the same series again: the next scrape began
                scrape += 1
                seen = set()
            seen.add(key)
            t = sample.timestamp if sample.timestamp is not None else scrape * interval
            value = float(sample.value)
            rec.gpu(node, gpu, labels.get("modelName")).add(
                float(t), BY_ID[fid].name, value if math.isfinite(value) else math.nan)
    if not rec.gpus:
        raise UsageError("no DCGM_FI_* metrics with a gpu label: not a dcgm-exporter scrape", file=str(p))
    rec.notes.append(f"{scrape + 1} scrapes")
    return rec

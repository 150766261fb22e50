"""dcgm-exporter ``/metrics`` scrapes saved one after another (e.g. ``while sleep 1; do
curl -s node:9400/metrics; done > scrapes.prom``), parsed with prometheus-client's text
parser. A scrape ends where a series repeats; a sample's own timestamp (milliseconds,
optional in the exposition format) is used when present, else scrape index x interval.

- the node is the ``Hostname`` label (``hostname`` in some deployments), else "node".
- a series with ``GPU_I_ID`` is a MIG GPU instance of GPU ``gpu`` (``GPU_I_PROFILE`` names
  its size): an entity of its own, indexed ``<gpu>/gi<GPU_I_ID>``, never a second sample
  of the whole GPU, whose series come without those labels in the same scrape.
- DCGM's blank sentinels (``recording.dcgm_blank``: 9223372036854775794 and the others)
  are missing values, never data.
- metrics the scorer does not model are kept under their lowercase name without the
  ``DCGM_FI_DEV_``/``DCGM_FI_PROF_`` prefix (``DCGM_FI_DEV_MEMORY_TEMP`` -> ``memory_temp``).
- a line holding only ``...`` (documentation eliding the rest) is skipped, and noted.
- dcgm-exporter declares energy and the PCIe/NVLink byte fields counters
  (etc/dcp-metrics-included.csv), and prometheus_client-style exposition names a
  counter's sample ``<name>_total``: that sample is the field itself (``_created`` is
  not data). A bare ``<known DCGM name>_total`` is read the same way.
- a series is one GPU (node, ``gpu``, ``GPU_I_ID``) and metric: other labels (``pod``,
  ``container``) do not make another GPU. A second series of the same GPU and metric in
  one scrape is a duplicate: the first is kept, and a note counts them. A scrape ends
  where a whole series (all its labels) repeats.
- a file whose samples mix exposition timestamps and none is refused: the two time
  bases (ms since 1970, scrape x interval) cannot share one axis.
- ``interval`` must be finite and above 0 (``recording.check_interval``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.samplers.fields import BY_ID
from hpcml.samplers.fields import DCGM_NAMES as NAMES
from hpcml.score.importers import read_text
from hpcml.score.recording import Recording, check_interval, dcgm_blank

_ELISION = re.compile(r"^\s*(\.\.\.|…)\s*$")
_PREFIX = re.compile(r"^DCGM_FI_(DEV_|PROF_)?")


def _parse(text: str, p: Path) -> list:
    from prometheus_client.parser import text_string_to_metric_families
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for lineno, line in enumerate(text.splitlines(), start=1):   # which line: parse each alone
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                list(text_string_to_metric_families(line + "\n"))
            except (ValueError, TypeError, IndexError) as one:
                msg = str(one).splitlines()[0] if str(one) else type(one).__name__
                raise UsageError(f"not Prometheus exposition text: {msg}", file=str(p), line=lineno) from None
        raise UsageError(f"not Prometheus exposition text: {first}", file=str(p)) from None


def _name(metric: str, family) -> str | None:
    if family.type == "counter" and metric == family.name + "_created":
        return None                             # when the counter was created: not a value
    if metric not in NAMES and metric.endswith("_total") and (
            family.type == "counter" and metric == family.name + "_total" or metric[:-6] in NAMES):
        metric = metric[:-6]                    # a counter's sample: the DCGM field itself
    fid = NAMES.get(metric)
    if fid is not None:
        return BY_ID[fid].name
    return _PREFIX.sub("", metric).lower() if metric.startswith("DCGM_FI_") else None


def load(path: str | Path, interval: float = 1.0) -> Recording:
    p = Path(path)
    interval = check_interval(interval)
    text = read_text(p, "a dcgm-exporter scrape file")
    lines = text.splitlines()
    elided = [i for i, line in enumerate(lines, start=1) if _ELISION.match(line)]
    if elided:
        text = "\n".join("" if _ELISION.match(line) else line for line in lines) + "\n"
    rec = Recording(source=f"dcgm-exporter:{p}")
    scrape = 0
    seen: set[tuple[str, str, str, str]] = set()       # GPU and metric, this scrape
    series: set[tuple] = set()                          # whole series (all labels), this scrape
    blanks = duplicates = 0
    stamped: set[bool] = set()
    for family in _parse(text, p):
        for sample in family.samples:
            name = _name(sample.name, family)
            if name is None:
                continue
            labels = sample.labels
            gpu = labels.get("gpu")
            if gpu is None:
                raise UsageError(f"{sample.name} has no gpu label", file=str(p))
            node = labels.get("Hostname") or labels.get("hostname") or "node"
            gi = labels.get("GPU_I_ID") or None
            key = (node, gpu, gi or "", name)
            whole = (sample.name, tuple(sorted(labels.items())))
            if whole in series:             # the same series again: the next scrape began
                scrape += 1
                seen, series = set(), set()
            series.add(whole)
            if key in seen:                 # another series of this GPU and metric (pod labels)
                duplicates += 1
                continue
            seen.add(key)
            stamped.add(sample.timestamp is not None)
            if len(stamped) > 1:
                raise UsageError("some samples carry a timestamp and others none: one time axis cannot hold both "
                                 "(a file made of different sources?)", file=str(p))
            t = sample.timestamp if sample.timestamp is not None else scrape * interval
            value = float(sample.value)
            if math.isfinite(value) and dcgm_blank(value):
                blanks += 1
                value = math.nan
            model = labels.get("modelName")
            g = (rec.gpu(node, gpu, model) if gi is None else
                 rec.instance(node, f"{gpu}/gi{gi}", {"gpu_i_id": gi, "gpu_i_profile": labels.get("GPU_I_PROFILE"),
                                                      "parent": gpu}, model))
            g.add(float(t), name, value if math.isfinite(value) else math.nan)
    if not rec.gpus:
        raise UsageError("no DCGM_FI_* metrics with a gpu label: not a dcgm-exporter scrape", file=str(p))
    rec.notes.append(f"{scrape + 1} scrape{'s' if scrape else ''}")
    if duplicates:
        rec.notes.append(f"{duplicates} duplicate series (same GPU and metric, other labels such as pod) "
                         "left out: the first of each scrape kept")
    if blanks:
        rec.notes.append(f"{blanks} value(s) were DCGM blank sentinels (not supported, not found, ...): "
                         "kept as missing")
    if elided:
        rec.notes.append(f"'...' elision line(s) at line {', '.join(map(str, elided))} skipped: the source left "
                         "series out there (a copy from documentation?), so this is not a whole scrape")
    instances = [g for g in rec.gpus.values() if g.mig]
    if instances:
        rec.notes.append(f"{len(instances)} MIG instance(s) (GPU_I_ID) kept apart from their parent GPUs")
    return rec

"""nvidia-smi dmon output, written the way nvidia-smi prints it (nvidia-smi(1), DEVICE
MONITORING: ``-s pucvmet`` columns, the ``# gpu``/``# Idx`` header pair, ``-o DT``, ``-i``,
``-`` for a value the GPU does not support, ``--format csv``), and the score it allows."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from rich.console import Console

from hpcml.errors import UsageError
from hpcml.score import importers
from hpcml.score.importers import smi_dmon
from hpcml.score.report import build
from hpcml.score.terminal import print_summary

PUCVMET = (
    "#Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec   jpg   ofa  mclk  pclk pviol tviol"
    "    fb  bar1  ccpm sbecc dbecc   pci rxpci txpci\n"
    "#YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %     %     %   MHz   MHz     %  bool"
    "    MB    MB    MB  errs  errs  errs  MB/s  MB/s\n")


def _row(date: str, time: str, gpu: int, pwr: int, sm: int | str, mem: int | str) -> str:
    return (f" {date}   {time}  {gpu:>5} {pwr:>5}    33     -  {sm:>4}  {mem:>4}     0     0     0     0  2619"
            f"  1980     0     0 40213     4     0     0     0     0   312    12\n")


def test_pucvmet_with_date_time_two_gpus(tmp_path):
    """``nvidia-smi dmon -s pucvmet -o DT -i 0,1``: rows of both GPUs per second."""
    f = tmp_path / "nid001.txt"
    rows = [_row("20250301", f"23:59:5{s}", g, 300 + g, 97 - g, 41 + g) for s in (8, 9) for g in (0, 1)]
    rows += [_row("20250302", "00:00:00", g, 300, "-", 40) for g in (0, 1)]
    f.write_text(PUCVMET + "".join(rows))
    assert importers.detect(f) == "nvidia-smi-dmon"
    rec = importers.load(f)
    assert rec.temporal_only and sorted(rec.gpus) == [("nid001", "0"), ("nid001", "1")]
    g0 = rec.gpus[("nid001", "0")].freeze()
    assert np.diff(g0.t).tolist() == [1.0, 1.0]                      # across midnight, from the dates
    assert g0.values["gpu_util"][:2].tolist() == [97, 97] and math.isnan(g0.values["gpu_util"][2])  # '-'
    assert g0.values["mem_util"][0] == 41 and g0.values["power_usage"][0] == 300
    assert g0.values["sm_clock"][0] == 1980 and g0.values["mem_clock"][0] == 2619
    assert g0.values["fb_used"][0] == 40213 and np.isnan(g0.values["memory_temp"]).all()
    assert {"enc", "pviol", "tviol", "rxpci", "txpci", "sbecc"} <= set(g0.values)
    assert not any(k.startswith(("pipe_", "dram", "pcie", "nvlink")) for k in g0.values)   # no saturation fields


def test_report_says_utilisation_only(tmp_path):
    f = tmp_path / "n.txt"
    f.write_text(PUCVMET + "".join(_row("20250301", f"12:00:{s:02d}", 0, 300, 97, 41) for s in range(10)))
    rep = build(importers.load(f))
    assert rep["temporal_only"] and rep["utilisation"] == {"gpu": 0.97, "memory": 0.41}
    assert rep["findings"][0].startswith("temporal utilisation only")
    assert any("no compute / memory / interconnect split" in n for n in rep["notes"])
    out = io.StringIO()
    print_summary(rep, None, Console(file=out, width=200))
    text = out.getvalue()
    assert "temporal utilisation only, no saturation" in text and "utilisation  0.97" in text
    assert "memory util  0.41" in text and "no compute / memory / interconnect split" in text
    assert "compute      " not in text


def test_plain_output_repeated_header_and_ticks(tmp_path):
    """``nvidia-smi dmon -s u`` (no -o): no times, a tick per round of GPUs; the header is
    printed again every so often."""
    head = "# gpu     sm    mem    enc    dec    jpg    ofa \n# Idx      %      %      %      %      %      % \n"
    rows = "".join(f"    {g}     {90 + g}     {30 + g}      0      0      0      0 \n" for g in (0, 1))
    f = tmp_path / "plain.log"
    f.write_text(head + rows * 2 + head + rows)
    rec = importers.load(f, interval=2.0)
    assert rec.meta["format"] == "nvidia-smi-dmon"
    g1 = rec.gpus[("plain", "1")]
    assert g1.t == [0.0, 2.0, 4.0] and g1.values["gpu_util"] == [91, 91, 91]
    assert any("3 ticks" in n for n in rec.notes)


def test_mig_rows_are_instances(tmp_path):
    """On a GPU in MIG mode a row with a GPU-instance id is that instance, not the GPU.
    (The ``gi``/``ci`` column names are hpcml's reading of the layout; see docs/score.md.)"""
    f = tmp_path / "mig.txt"
    f.write_text("# gpu    gi    ci    pwr     sm    mem\n# Idx   Idx   Idx      W      %      %\n"
                 "    0     -     -     91     -      -\n    0     1     0      -     88     20\n"
                 "    0     -     -     92     -      -\n    0     1     0      -     90     21\n")
    rec = smi_dmon.load(f)
    gpu, inst = rec.gpus[("mig", "0")], rec.gpus[("mig", "0/gi1/ci0")]
    assert gpu.mig is None and gpu.t == [0.0, 1.0] and gpu.values["power_usage"] == [91, 92]
    assert inst.mig == {"gpu_i_id": "1", "gpu_ci_id": "0", "parent": "0"} and inst.values["gpu_util"] == [88, 90]
    rep = build(rec)
    assert rep["gpus"] == 1 and rep["instances"]["count"] == 1


def test_csv_format(tmp_path):
    """``--format csv``: the same header pair and rows, cells separated by commas."""
    f = tmp_path / "c.csv"
    f.write_text("#Date, Time, gpu, pwr, sm, mem\n#YYYYMMDD, HH:MM:SS, Idx, W, %, %\n"
                 "20250301, 12:00:00, 0, 70, 5, 1\n20250301, 12:00:01, 0, 71, -, 2\n")
    g = importers.load(f).gpus[("c", "0")]
    assert g.t[1] - g.t[0] == 1.0 and g.values["power_usage"] == [70, 71] and math.isnan(g.values["gpu_util"][1])


def test_time_only_across_midnight(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("#Time        gpu    sm   mem\n#HH:MM:SS    Idx     %     %\n"
                 " 23:59:59      0    10     1\n 00:00:01      0    20     2\n")
    rec = importers.load(f)
    assert np.diff(rec.gpus[("t", "0")].t).tolist() == [2.0]
    assert any("seconds of the day" in n for n in rec.notes)


@pytest.mark.parametrize("text, words", [
    ("    0    50    10\n", r":1: no '# gpu \.\.\.' header"),
    ("# gpu    sm   mem\n# Idx     %     %\n    0    50\n", r":3: 2 cells under 3 columns"),
    ("# gpu    sm   mem\n# Idx     %     %\n    x    50    10\n", r":3: GPU index 'x'"),
    ("#Date  Time  gpu  sm\n#YYYYMMDD HH:MM:SS Idx %\n 2025-03-01 12:00:00 0 5\n", r":3: date/time"),
    ("# gpu\n# Idx\n", r":1: .*names no metrics"),
    ("# gpu   sm\n# Idx    %\n", "no GPU rows"),
])
def test_bad_input_one_line(tmp_path, text, words):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(UsageError, match=words) as err:
        smi_dmon.load(tmp_path / "bad.txt")
    assert "\n" not in str(err.value) and "bad.txt" in str(err.value)
    with pytest.raises(UsageError, match="above 0"):
        smi_dmon.load(tmp_path / "bad.txt", interval=-1)

"""``hpcml data``: the command group; each command (pack, doctor, stage, bench) has its own
module. Parse arguments, call the data engines, render: no data logic here."""

from __future__ import annotations

import typer

from hpcml.cli_support import Group
from hpcml.data.cli import bench, doctor, index, pack, stage  # one module per command

app = typer.Typer(name="data", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Datasets on HPC storage: doctor, pack into shards, index shards made elsewhere, stage, benchmark the loader.\n\n"
                       "Example: [bold]hpcml data doctor /scratch/imagenet[/]\n\n"
                       "Exit codes: 0 done, 2 bad input (missing path, unreadable files, corrupt shard, "
                       "checksum mismatch).")

app.command("pack")(pack.pack_command)
app.command("doctor")(doctor.doctor)
app.command("index")(index.index_command)
app.command("stage")(stage.stage)
app.command("bench")(bench.bench)

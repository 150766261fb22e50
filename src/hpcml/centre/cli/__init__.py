"""``hpcml centre``: the centre's commands, one module each; arguments in, the centre's code out.

``serve`` runs the collector (``hpcml.centre.collector``), ``handle`` (and ``rules``) the node
handler (``hpcml.centre.handler``), ``report`` the centre's report (``hpcml.centre.report``).
``hpcml vet serve``, ``hpcml vet handle``, ``hpcml vet rules`` and ``hpcml vet fleet-report`` are
aliases of these, registered by ``hpcml.vet.cli`` with the same callbacks.
"""

from __future__ import annotations

import typer

from hpcml.centre.cli import handle, report, serve  # one module per command
from hpcml.cli_support import Group

app = typer.Typer(name="centre", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="The centre's side: the collector that keeps vetting results and job summaries "
                       "across jobs, the node handler that drains and resumes nodes from them, and the "
                       "centre's report over them.\n\n"
                       "Example: [bold]hpcml centre serve --db sqlite:///vet.db[/]\n\n"
                       "Exit codes: 0 ok, 1 database, port or Slurm error, 2 bad option or input.")
app.command("serve")(serve.serve)
app.command("handle")(handle.handle)
app.command("rules")(handle.validate_rules)
app.command("report")(report.report)

"""``hpcml ckpt``: list, verify and prune checkpoint directories written by
``hpcml.ckpt.Checkpointer``. Parse, call ``hpcml.ckpt.inventory``, render."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcml.cli_support import Group

app = typer.Typer(name="ckpt", cls=Group, no_args_is_help=True, rich_markup_mode="rich",
                  help="Checkpoints written by hpcml.ckpt: list, verify, prune, export.\n\n"
                       "Example: [bold]hpcml ckpt ls $SCRATCH/run1/ckpt[/]\n\n"
                       "Exit codes: 0 good, 1 a checkpoint is corrupt or incomplete (verify), 2 bad input.")


def _render(inv) -> None:
    from rich.console import Console
    from rich.table import Table

    from hpcml.units import fmt_bytes
    from hpcml.words import LINE_MAX, shown
    table = Table(title=f"checkpoints in {shown(inv.root, LINE_MAX)}")
    for col in ("step", "state", "size", "world", "tiers", "problem"):
        table.add_column(col)
    for e in inv.entries:
        table.add_row(str(e.step), e.state, fmt_bytes(e.size) if e.size is not None else "–", str(e.world_size or "–"),
                      shown(",".join(e.tiers)), shown(e.problems[0], LINE_MAX) if e.problems else "")
    Console().print(table)


@app.command("ls")
def ls(directory: Path = typer.Argument(..., help="The checkpoint directory."),
       local: Optional[Path] = typer.Option(None, "--local", help="The local tier (e.g. $SLURM_TMPDIR/ckpt) to show."),
       as_json: bool = typer.Option(False, "--json", help="Print JSON (hpcml.ckpt.list/1).")) -> None:
    """Steps, sizes, tiers and state (committed, partial, corrupt) of every checkpoint.

        hpcml ckpt ls $SCRATCH/run1/ckpt
    """
    from hpcml.ckpt.inventory import inventory
    from hpcml.cli_support import show
    show(inventory(directory, local=local), as_json, _render)


@app.command("verify")
def verify(directory: Path = typer.Argument(..., help="The checkpoint directory."),
           step: Optional[int] = typer.Argument(None, help="Only this step (default: every one)."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON (hpcml.ckpt.list/1).")) -> None:
    """Read every file and check sizes and crc32 against the manifest; exit 1 if any
    committed checkpoint is corrupt.

        hpcml ckpt verify $SCRATCH/run1/ckpt 12000
    """
    from hpcml.ckpt.inventory import inventory
    from hpcml.cli_support import show
    inv = inventory(directory, verify=True, step=step)
    show(inv, as_json, _render)
    corrupt = [e.step for e in inv.entries if e.state == "corrupt"]
    if not as_json:
        print(_verdict(inv.entries, corrupt))
    raise typer.Exit(1 if corrupt else 0)


def _verdict(entries, corrupt: list[int]) -> str:
    """The table's last line in words: a researcher reads this, not the state column."""
    from hpcml.words import plural
    committed = [e for e in entries if e.state in ("committed", "corrupt")]
    other = len(entries) - len(committed)
    tail = f"; {other} partial or superseded not counted" if other else ""
    if corrupt:
        return (f"{len(corrupt)} of {plural(len(committed), 'checkpoint')} corrupt (step "
                f"{', '.join(map(str, corrupt))}){tail}")
    if not committed:
        return f"no committed checkpoint to verify{tail}"
    return f"{'all ' if len(committed) > 1 else ''}{plural(len(committed), 'checkpoint')} " \
           f"{'verifies' if len(committed) == 1 else 'verify'}{tail}"


@app.command("prune")
def prune(directory: Path = typer.Argument(..., help="The checkpoint directory."),
          keep: int = typer.Option(..., "--keep", min=1, help="Checkpoints that verify to keep (the newest)."),
          local: Optional[Path] = typer.Option(None, "--local", help="Also prune this local tier.")) -> None:
    """Keep the newest N checkpoints that verify (crc32); remove older ones and partial ones
    no running job writes. Corrupt ones newer than those kept stay and are listed as skipped;
    symbolic links are never followed nor removed.

        hpcml ckpt prune $SCRATCH/run1/ckpt --keep 2
    """
    from hpcml.ckpt import owner
    from hpcml.ckpt.inventory import open_root
    from hpcml.ckpt.prune import prune as do_prune
    open_root(directory)
    done = do_prune(directory, keep, local=local, live_token=owner.live_token(directory))
    for path in done.removed:
        print(f"removed {path}")
    for line in done.skipped:
        print(f"skipped {line}")


@app.command("export")
def export(directory: Path = typer.Argument(..., help="The checkpoint directory (or one step's directory)."),
           step: Optional[int] = typer.Argument(None, help="The step (default: the newest committed one)."),
           to: Path = typer.Option(..., "--to", help="The safetensors file to write (mode 0600)."),
           rank: Optional[int] = typer.Option(None, "--rank", help="Whose shard of a sharded checkpoint."),
           key: Optional[str] = typer.Option(None, "--key", help="Only this part of the state, its prefix cut off "
                                             "(e.g. model: names as in model.state_dict())."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON (hpcml.ckpt.export/1).")) -> None:
    """Write one checkpoint's tensors to a safetensors file, after checking it like a load
    (sizes, crc32); no Slurm, torch.distributed or torch needed. Values that are not tensors
    are left out and listed.

        hpcml ckpt export $SCRATCH/run1/ckpt 12000 --key model --to model.safetensors
    """
    from hpcml.ckpt.export import export as do_export
    from hpcml.cli_support import show
    from hpcml.units import fmt_bytes
    done = do_export(directory, to, step, rank=rank, key=key)
    show(done, as_json, lambda d: print(f"wrote {d.path}: {d.tensors} tensors, {fmt_bytes(d.bytes)} (step {d.step}, "
                                        f"rank {d.rank})" + (f"; left out: {', '.join(d.left_out)}" if d.left_out else "")))

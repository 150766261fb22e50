"""The step an unchanged framework resumed at: HF Trainer's and Lightning's global step.

A script that resumes from its own checkpoint (``trainer.train(resume_from_checkpoint=...)``,
``Trainer.fit(ckpt_path=...)``) tells no one which step it resumed at, so a restart's lost
steps were unknown. ``hpcml run``'s sitecustomize calls ``hook_transformers`` /
``hook_lightning`` when the framework's trainer module is first imported: every Trainer
made from then on gets a callback that, when training starts, reads the restored global
step. A resumed one (step > 0) is written where the run's record reads it
(``hpcml.cluster.requeue.note_resumed``, rank 0 only, as hpcml.ckpt does) and the rank's
optimizer steps continue from it (``optimsteps.resume_at``). Nothing is changed in the
training; any error leaves it as it was.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from typing import Any

from hpcml.observe import optimsteps

log = logging.getLogger(__name__)
HF = "transformers.trainer"
LIGHTNING = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


def resumed(step: Any, checkpoint: Any, rank0: bool) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        return
    optimsteps.resume_at(step)
    if rank0:
        from hpcml.cluster.requeue import note_resumed
        note_resumed(step, str(checkpoint or ""))


def _add_after_init(cls: Any, add: Any) -> None:
    """``cls.__init__`` then ``add(self)``; once per class."""
    init = cls.__init__
    if getattr(init, "__hpcml_resumes__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            add(self)
        except Exception as exc:  # noqa: BLE001 - the training runs as without us
            log.debug("hpcml: resume step not followed: %s", exc)

    __init__.__hpcml_resumes__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _safely(hook: Any) -> Any:
    """Run as the framework's module finishes importing: an error must not reach the import."""
    @functools.wraps(hook)
    def run(*args: Any) -> None:
        try:
            hook(*args)
        except Exception as exc:  # noqa: BLE001
            log.debug("hpcml: resume step not followed: %s", exc)
    return run


@_safely
def hook_transformers() -> None:
    callback = importlib.import_module("transformers.trainer_callback").TrainerCallback
    mod = sys.modules[HF]

    class Resumed(callback):                      # type: ignore[misc,valid-type]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            resumed(state.global_step, getattr(args, "output_dir", ""), bool(state.is_world_process_zero))

    _add_after_init(mod.Trainer, lambda trainer: trainer.add_callback(Resumed()))


@_safely
def hook_lightning(module: str) -> None:
    package = module.rsplit(".trainer.trainer", 1)[0]               # lightning.pytorch / pytorch_lightning
    callback = importlib.import_module(package + ".callbacks.callback").Callback
    mod = sys.modules[module]

    class Resumed(callback):                      # type: ignore[misc,valid-type]
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            resumed(trainer.global_step, getattr(trainer, "ckpt_path", ""), trainer.global_rank == 0)

    _add_after_init(mod.Trainer, lambda trainer: trainer.callbacks.append(Resumed()))

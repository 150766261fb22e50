"""Lightning as a user runs it with checkpoints: a tiny ``LightningModule``, 2 ranks over gloo
on CPU (``strategy="ddp"``), a ``ModelCheckpoint`` every SAVE steps in OUT, resumed from
``last.ckpt`` when the script starts again (``fit(ckpt_path=...)``). No hpcml in it
(tests/run/test_resume_frameworks.py).

Each optimizer step is appended to LEDGER (attempt, rank, global step: O_APPEND); on the
first attempt rank KILL_RANK kills itself (SIGKILL) once it completed step KILL_AT (3 s later: a rank dies some time after its last step).
"""

import os
import signal
import time

import lightning.pytorch as pl
import torch

OUT = os.environ["OUT"]
STEPS = int(os.environ.get("STEPS", "20"))
SAVE = int(os.environ.get("SAVE", "5"))
KILL_AT = int(os.environ.get("KILL_AT", "13"))
KILL_RANK = int(os.environ.get("KILL_RANK", "1"))
ATTEMPT = os.environ.get("HPCML_RUN_ATTEMPT", "0")


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        step = self.trainer.global_step
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{ATTEMPT} {self.global_rank} {step}\n".encode())
        os.close(fd)
        if ATTEMPT == "0" and self.global_rank == KILL_RANK and step == KILL_AT:
            time.sleep(3)           # the last steps reach hpcml's records (flushed each second; margin for a loaded machine)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(4096, 4))
    every = pl.callbacks.ModelCheckpoint(dirpath=OUT, every_n_train_steps=SAVE, save_last=True, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1,
                         strategy="ddp", max_steps=STEPS, logger=False, callbacks=[every],
                         enable_progress_bar=False, enable_model_summary=False)
    last = os.path.join(OUT, "last.ckpt")
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2), ckpt_path=last if os.path.exists(last) else None)


if __name__ == "__main__":
    main()

"""Lightning on a tiny ``LightningModule``, 2 ranks over gloo on CPU (``strategy="ddp"``, the
processes started by ``hpcml run``), as a user runs it: no hpcml in it
(tests/run/test_inject_frameworks.py).

STEPS optimizer steps (``max_steps``) of ACCUM micro-batches each, each step's compute taking
STEP_S seconds, SLOW times as long on SLOW_RANK (a slow node); STUCK_RANK blocks forever once
it completed STUCK_AFTER steps (the line ends in ``# culprit``).
"""

import os
import threading
import time

import lightning.pytorch as pl
import torch

STEPS = int(os.environ.get("STEPS", "6"))
ACCUM = int(os.environ.get("ACCUM", "2"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_AFTER = int(os.environ.get("STUCK_AFTER", "3"))
STEP_S = float(os.environ.get("STEP_S", "0"))
SLOW = float(os.environ.get("SLOW", "2")) if os.environ["RANK"] == os.environ.get("SLOW_RANK") else 1.0


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_S * SLOW / ACCUM)
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.global_rank == STUCK_RANK and self.trainer.global_step == STUCK_AFTER:
            threading.Event().wait()  # culprit


def main() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(4096, 4))
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1,
                         strategy="ddp", max_steps=STEPS, accumulate_grad_batches=ACCUM, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    print(f"rank {trainer.global_rank}: {STEPS} optimizer steps", flush=True)


if __name__ == "__main__":
    main()

"""Lightning on a tiny ``LightningModule``, 2 ranks over gloo on CPU (``strategy="ddp"``, the
processes started by ``hpcml run``), as a user runs it: no hpcml in it
(tests/run/test_inject_frameworks.py).

STEPS optimizer steps (``max_steps``) of ACCUM micro-batches each; STUCK_RANK blocks forever
once it completed STUCK_AFTER steps (the line ends in ``# culprit``).
"""

import os
import threading

import lightning.pytorch as pl
import torch

STEPS = int(os.environ.get("STEPS", "6"))
ACCUM = int(os.environ.get("ACCUM", "2"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_AFTER = int(os.environ.get("STUCK_AFTER", "3"))


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
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

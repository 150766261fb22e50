"""Lightning as a sweep task runs it: a tiny ``LightningModule`` on CPU, the learning rate
from argv, its loss logged with ``self.log`` through Lightning's ``CSVLogger`` (its default
where tensorboard is not installed; named here so the test does not depend on that) into
``lightning_logs/version_0/metrics.csv``. No hpcml in it (tests/run/test_farmresults.py).
Each optimizer step is appended to LEDGER (O_APPEND): the script's own count."""

import os
import sys

import lightning.pytorch as pl
import torch

STEPS = int(os.environ.get("STEPS", "12"))


class Tiny(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{os.environ['HPCML_FARM_TASK_ID']} {self.trainer.global_step}\n".encode())
        os.close(fd)


def main() -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=pl.loggers.CSVLogger("."),
                         log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.fit(Tiny(float(sys.argv[1])), torch.utils.data.DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()

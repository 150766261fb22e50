"""HF transformers' ``Trainer`` as a sweep task runs it: a tiny GPT-2 from a config (no
download), one process on CPU, the learning rate from argv, logging every 2 steps and a
checkpoint at the end (``checkpoint-N/trainer_state.json``, HF's own). No hpcml in it
(tests/run/test_farmresults.py). Each optimizer step is appended to LEDGER (O_APPEND): the
script's own count."""

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

STEPS = int(os.environ.get("STEPS", "8"))


class Ledger(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{os.environ['HPCML_FARM_TASK_ID']} {state.global_step}\n".encode())
        os.close(fd)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict:
        ids = (torch.arange(16) + i) % 64
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir="out", max_steps=STEPS, per_device_train_batch_size=2, use_cpu=True,
                             learning_rate=float(sys.argv[1]), report_to=[], save_strategy="steps",
                             save_steps=STEPS, logging_strategy="steps", logging_steps=2, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Ledger()]).train()


if __name__ == "__main__":
    main()

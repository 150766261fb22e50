"""HF transformers' ``Trainer`` on a tiny GPT-2 built from a config (no download), 2 ranks
over gloo on CPU, as a user runs it: no hpcml in it (tests/run/test_inject_frameworks.py).

STEPS optimizer steps (``max_steps``) of ACCUM micro-batches each, each step's data taking
STEP_S seconds to load, SLOW times as long on SLOW_RANK (a slow node); STUCK_RANK blocks
forever in a callback once it completed STUCK_AFTER steps (the line ends in ``# culprit``).
"""

import os
import threading
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

STEPS = int(os.environ.get("STEPS", "6"))
ACCUM = int(os.environ.get("ACCUM", "2"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_AFTER = int(os.environ.get("STUCK_AFTER", "3"))
STEP_S = float(os.environ.get("STEP_S", "0"))
SLOW = float(os.environ.get("SLOW", "2")) if os.environ["RANK"] == os.environ.get("SLOW_RANK") else 1.0
BATCH = 2


class Stuck(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if int(os.environ["RANK"]) == STUCK_RANK and state.global_step == STUCK_AFTER:
            threading.Event().wait()  # culprit


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        time.sleep(STEP_S * SLOW / (BATCH * ACCUM))
        ids = (torch.arange(16) + i) % 64
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir="hf-out", max_steps=STEPS, per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=ACCUM, use_cpu=True, ddp_backend="gloo", report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Stuck()]).train()
    print(f"rank {os.environ['RANK']}: {STEPS} optimizer steps", flush=True)


if __name__ == "__main__":
    main()

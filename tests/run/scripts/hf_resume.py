"""HF transformers' ``Trainer`` as a user runs it with checkpoints: a tiny GPT-2 from a config
(no download), 2 ranks over gloo on CPU, a checkpoint every SAVE steps in OUT, resumed from
the last one when the script starts again (``get_last_checkpoint``: HF's own pattern). No
hpcml in it (tests/run/test_resume_frameworks.py).

Each optimizer step is appended to LEDGER (attempt, rank, global step: O_APPEND, the
script's own ledger); on the first attempt rank KILL_RANK kills itself (SIGKILL) once it
completed step KILL_AT (3 s later: a rank dies some time after its last step).
"""

import os
import signal
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

OUT = os.environ["OUT"]
STEPS = int(os.environ.get("STEPS", "20"))
SAVE = int(os.environ.get("SAVE", "5"))
KILL_AT = int(os.environ.get("KILL_AT", "13"))
KILL_RANK = int(os.environ.get("KILL_RANK", "1"))
ATTEMPT = os.environ.get("HPCML_RUN_ATTEMPT", "0")
RANK = int(os.environ["RANK"])


class Ledger(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{ATTEMPT} {RANK} {state.global_step}\n".encode())
        os.close(fd)
        if ATTEMPT == "0" and RANK == KILL_RANK and state.global_step == KILL_AT:
            time.sleep(3)           # the last steps reach hpcml's records (flushed each second; margin for a loaded machine)
            os.kill(os.getpid(), signal.SIGKILL)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        ids = (torch.arange(16) + i) % 64
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=OUT, max_steps=STEPS, per_device_train_batch_size=2, use_cpu=True,
                             ddp_backend="gloo", report_to=[], save_strategy="steps", save_steps=SAVE,
                             logging_strategy="no", disable_tqdm=True)
    last = get_last_checkpoint(OUT) if os.path.isdir(OUT) else None
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Ledger()]).train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()

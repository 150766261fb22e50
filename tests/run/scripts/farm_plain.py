"""A plain torch loop as a sweep task runs it: the learning rate from argv, one JSON line
of its loss every step into out/metrics.jsonl (the file the sweep names with
``metrics_file:``), STEPS optimizer steps. No hpcml in it (tests/run/test_farmresults.py).
Each optimizer step is appended to LEDGER (O_APPEND): the script's own count."""

import json
import os
import sys

import torch

STEPS = int(os.environ.get("STEPS", "10"))


def main() -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=float(sys.argv[1]))
    os.makedirs("out", exist_ok=True)
    with open("out/metrics.jsonl", "a") as log:
        for step in range(1, STEPS + 1):
            loss = net(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.write(json.dumps({"step": step, "loss": loss.item(), "note": "text is not a metric"}) + "\n")
            log.flush()
            fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{os.environ['HPCML_FARM_TASK_ID']} {step}\n".encode())
            os.close(fd)


if __name__ == "__main__":
    main()

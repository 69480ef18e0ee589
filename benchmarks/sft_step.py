"""What an SFT step costs against a pretraining step (docs/benchmarks.md, "Chat: SFT on the CPU"):
the SFT run's model trained one step at a time on its own batches (ChatLoader: packed conversations,
targets -1 off the answers) and on Tiny Shakespeare's windows (BatchLoader), alternately, so that
both meet the same load; the loaders' own time is measured apart.

    python -m benchmarks.sft_step --run RUN_DIR [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks import load_avg
from common.platform import configure_threads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sft_step")
    p.add_argument("--run", required=True, help="an SFT run directory (experiment=sft_cpu)")
    p.add_argument("--steps", type=int, default=20, help="timed steps of each kind (default 20)")
    a = p.parse_args(argv)
    # as train.py does: threads that sleep rather than spin on busy cores (common/platform.py)
    configure_threads()
    import torch

    from checkpoint.file import load_model
    from checkpoint.locate import resolve_checkpoint
    from data.chat_loader import build_loader
    from data.config import DataConfig
    from data.prepare import prepare
    from training.optim import build_optimizer
    ckpt = torch.load(resolve_checkpoint(a.run), weights_only=True, map_location="cpu")
    cfg = ckpt["config"]
    model, _ = load_model(resolve_checkpoint(a.run))
    model.train()
    t, o = cfg["train"], cfg["optim"]
    block, batch = model.config.block_size, t["batch_size"]
    chat = build_loader(prepare(DataConfig(**cfg["data"]), progress=False), block, batch, seed=0)
    text = build_loader(prepare(DataConfig(name="shakespeare_char"), progress=False), block, batch,
                        seed=0)
    opt = build_optimizer(model, lr=o["lr"], weight_decay=o["weight_decay"],
                          betas=(o["beta1"], o["beta2"]), device_type="cpu", name=o["name"],
                          muon_lr=o["muon_lr"], muon_momentum=o["muon_momentum"])
    times = {"pretraining (BatchLoader)": [], "SFT (ChatLoader)": []}
    loaders = dict(zip(times, (text, chat)))
    for i in range(a.steps + 3):
        for kind, loader in loaders.items():
            start = time.perf_counter()
            x, y = loader.next_batch()
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            # the first steps warm up the allocator and the optimizer's state
            if i >= 3:
                times[kind].append(time.perf_counter() - start)
    batches = {}
    for kind, loader in loaders.items():
        start = time.perf_counter()
        for _ in range(200):
            loader.next_batch()
        batches[kind] = (time.perf_counter() - start) / 200 * 1000
    out = {kind: {"ms_per_step": round(statistics.median(v) * 1000, 1),
                  "loader_ms_per_batch": round(batches[kind], 2)} for kind, v in times.items()}
    print(json.dumps({"run": a.run, "batch": f"{batch} x {block}", "steps": a.steps,
                      "threads": torch.get_num_threads(), "load": load_avg(), **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

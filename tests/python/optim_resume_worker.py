"""One process of test_optimizer_budgets.py's resumes: a small transformers Llama trained with an
optimizer whose state lives on NVMe below a DRAM budget smaller than the state, saved, and loaded
again in a new process at the same budget, the way users do it.

    optim_resume_worker.py loop    KIND DRAM NVME_DIR OUT STEPS [SAVE_AT] [LOAD]
    optim_resume_worker.py trainer KIND DRAM NVME_DIR OUT STEPS [RESUME_FROM]

KIND is cpu_adam (tiermem.torch.CPUAdam, state_tier="nvme") or offload (torch.optim.AdamW with
offload_optimizer_state(tier="nvme")). `loop`: a plain training loop of STEPS steps (counted from
the checkpoint's when LOAD names one), saving model and optimizer with torch.save after SAVE_AT of
them; `trainer`: transformers' Trainer to max_steps STEPS, a checkpoint every 3 steps, resumed
from RESUME_FROM. Either writes OUT/params.pt (the final parameters) and OUT/losses.json."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

VOCAB, SEQ, BATCH, LR = 256, 32, 2, 1e-3


def model():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=SEQ)
    return LlamaForCausalLM(cfg)


def optimizer(kind, m, rt):
    if kind == "cpu_adam":
        return tt.CPUAdam(m.parameters(), lr=LR, runtime=rt, state_tier="nvme", threads=1)
    opt = torch.optim.AdamW(m.parameters(), lr=LR, foreach=False)
    return tt.offload_optimizer_state(opt, rt, tier="nvme")


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loop(kind, rt, out, steps, save_at=None, load=None):
    m = model()
    opt = optimizer(kind, m, rt)
    start = 0
    if load is not None:
        ckpt = torch.load(load, weights_only=False)
        m.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        start = ckpt["step"]
    losses = []
    for i in range(start, start + steps):
        x = batch(i)
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if save_at is not None and i + 1 == save_at:
            torch.save({"model": m.state_dict(), "optim": opt.state_dict(), "step": i + 1},
                       os.path.join(out, "ckpt.pt"))
    return m, losses


class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = batch(i)[0]
        return {"input_ids": x, "labels": x}


def trainer(kind, rt, out, steps, resume=None):
    from transformers import Trainer, TrainingArguments
    m = model()
    args = TrainingArguments(output_dir=os.path.join(out, "run"), max_steps=steps,
                             per_device_train_batch_size=BATCH, learning_rate=LR,
                             save_strategy="steps", save_steps=3, logging_steps=1,
                             report_to=[], use_cpu=True, seed=0, data_seed=0,
                             lr_scheduler_type="constant", dataloader_num_workers=0,
                             disable_tqdm=True)
    opt = optimizer(kind, m, rt)
    t = Trainer(model=m, args=args, train_dataset=_Tokens(), optimizers=(opt, None))
    t.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    return m, losses


def main():
    mode, kind, dram, nvme_dir, out, steps = sys.argv[1:7]
    rest = sys.argv[7:]
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    with tiermem.Runtime(device="emulated", hbm_bytes="8MiB", dram_bytes=dram,
                         nvme_paths=nvme_dir, nvme_bytes="64MiB", log_level="error") as rt:
        if mode == "loop":
            save_at = int(rest[0]) if rest and rest[0] != "-" else None
            load = rest[1] if len(rest) > 1 else None
            m, losses = loop(kind, rt, out, int(steps), save_at, load)
        else:
            m, losses = trainer(kind, rt, out, int(steps), rest[0] if rest else None)
        state = 12 * sum(p.numel() for p in m.parameters())
        tier = rt.stats()["tiers"]["dram"]["capacity"]
        torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
                   os.path.join(out, "params.pt"))
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(dict(losses=losses, state_bytes=state, dram_tier=tier), f)


if __name__ == "__main__":
    main()

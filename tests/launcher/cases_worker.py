"""Run several training configurations in one torchrun launch (saves process start-up time in tests).

    torchrun --standalone --nproc-per-node N tests/launcher/cases_worker.py CASES.json OUT.json

CASES.json: a list of {"name", "config" (a full RunConfig mapping), "mode": "losses" | "grads" | "finetune" | "wrap"}.
Every case is run through the real training core (`launcher.core.train`); rank 0 writes {name: result} to
OUT.json, where a result is the per-step losses, or for "grads" the loss and the full (unsharded) gradient norms
and checksums after one forward/backward, or for "finetune" what `finetune_case` checks, or for "wrap" how the core
wrapped the model (`wrap_case`), or {"error": message}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from meshplan.launcher.core.config import RunConfig  # noqa: E402
from meshplan.launcher.core.model import clean_fqn  # noqa: E402
from meshplan.launcher.core.train import Trainer, init_distributed, run  # noqa: E402


def grads_case(cfg: RunConfig, device: torch.device) -> dict:
    """Loss and per-parameter full gradients after one forward/backward (no optimizer step)."""
    from torch.distributed.tensor import DTensor

    trainer = Trainer(cfg, device)
    inputs, labels = trainer.next_batch()
    loss = trainer.global_loss(trainer.forward_backward(inputs, labels))
    grads = {}
    for part in trainer.parts:
        for name, p in part.named_parameters():
            g = p.grad
            if g is None:
                grads[clean_fqn(name)] = None
                continue
            g = g.full_tensor() if isinstance(g, DTensor) else g
            grads[clean_fqn(name)] = g.detach().float().cpu().flatten().tolist()
    return {"loss": loss, "grads": grads}


def wrap_case(cfg: RunConfig, device: torch.device) -> dict:
    """The classes of the model parts (FSDPTransformer under FSDP2, DDPTransformer under DDP), the parameters' types
    and dtypes, and whether the training step runs under torch.autocast (after one step, the losses too)."""
    trainer = Trainer(cfg, device)
    params = [p for part in trainer.parts for p in part.parameters()]
    with trainer._amp_context():
        autocast = torch.is_autocast_enabled(device.type)
    return {"parts": sorted({type(part).__name__ for part in trainer.parts}),
            "param_types": sorted({type(p).__name__ for p in params}),
            "dtypes": sorted({str(p.dtype) for p in params}), "autocast": autocast, "log": trainer.wrapping(),
            "loss": trainer.train_step()["loss"]}


def _local(param: torch.Tensor) -> torch.Tensor:
    """A parameter's local values as a plain fp32 tensor (NF4 dequantized)."""
    from torch.distributed.tensor import DTensor

    t = param.to_local() if isinstance(param, DTensor) else param
    if hasattr(t, "get_original_weight"):
        t = t.get_original_weight()
    return t.detach().float().cpu().clone()


def finetune_case(cfg: RunConfig, device: torch.device) -> dict:
    """Build the trainer from `cfg.init_from`, compare every loaded shard with the file's slice (QLoRA: with the
    file's tensor quantized to NF4 as a whole), train `cfg.steps` steps, and report the losses, which parameters
    the optimizer holds, and whether the frozen weights stayed as loaded and the adapters moved."""
    from torchao.quantization import to_nf4

    from meshplan.launcher.core import hf_weights

    trainer = Trainer(cfg, device)
    ckpt = hf_weights.HFCheckpoint(cfg.init_from)
    mismatched, loaded, before = [], 0, {}
    for part in trainer.parts:
        for raw, param in part.named_parameters():
            name = clean_fqn(raw)
            before[name] = _local(param)
            key = hf_weights.hf_key(name, cfg.model)
            if key is None:
                continue
            offset, shape = hf_weights.local_box(param)
            whole = ckpt.handle(ckpt.tensors[key].file).get_tensor(key)
            if hasattr(param.to_local() if hasattr(param, "to_local") else param, "get_original_weight"):
                whole = to_nf4(whole.to(torch.bfloat16)).get_original_weight()
            box = whole[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
            loaded += 1
            if not torch.equal(box.float(), before[name]):
                mismatched.append(name)
    ckpt.close()
    trainable = sorted(clean_fqn(n) for part in trainer.parts for n, p in part.named_parameters() if p.requires_grad)
    in_optimizer = sum(len(g["params"]) for o in trainer.optimizers for g in o.param_groups)
    losses = [trainer.train_step()["loss"] for _ in range(cfg.steps)]
    changed, unchanged = [], []
    for part in trainer.parts:
        for raw, param in part.named_parameters():
            name = clean_fqn(raw)
            (unchanged if torch.equal(_local(param), before[name]) else changed).append(name)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mismatched, changed))
    mismatched = sorted({n for m, _ in gathered for n in m})
    changed = sorted({n for _, c in gathered for n in c})
    unchanged = sorted(set(unchanged) - set(changed))
    return {"losses": losses, "loaded": loaded, "mismatched": mismatched, "trainable": trainable,
            "in_optimizer": in_optimizer, "changed": sorted(changed), "unchanged": sorted(unchanged),
            "pretrained": vars(trainer.pretrained_stats) if trainer.pretrained_stats is not None else None}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, dict] = {}
    first = RunConfig.from_dict(cases[0]["config"])
    device = init_distributed(first)
    rank = dist.get_rank()
    for case in cases:
        try:
            cfg = RunConfig.from_dict(case["config"])
            if case.get("mode") == "grads":
                out[case["name"]] = grads_case(cfg, device)
            elif case.get("mode") == "wrap":
                out[case["name"]] = wrap_case(cfg, device)
            elif case.get("mode") == "finetune":
                out[case["name"]] = finetune_case(cfg, device)
            else:
                recs = run(cfg, device, log=False)
                out[case["name"]] = {"losses": [r["loss"] for r in recs]}
        except Exception as exc:  # one failing case must not hide the others
            traceback.print_exc()
            out[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
        dist.barrier()
    if rank == 0:
        Path(sys.argv[2]).write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The estimator on published fine-tuning memory and speed figures (torchtune, Hugging Face PEFT, Answer.AI).

    python benchmarks/finetune_published.py [--json]

Each case is a published run's configuration, predicted with `meshplan estimate`'s own code; none of these figures
is in the calibration set and no fine-tuning constant was fitted to them (the constants in
`data/stacks/torchtitan.yaml`'s `finetune:` section are stated assumptions). meshplan models torchtitan's and its own
core's behaviour (FSDP2, full-vocabulary fp32 logits, torchao NF4), so the frameworks' differences that the table
names per row (chunked cross-entropy, bitsandbytes, activation offloading, FSDP1) are part of each error.

Units as published: torchtune and Answer.AI state GiB; the Hugging Face pages say "GB" without saying which.
torchtune's README tokens/s are over all GPUs of the run (per GPU they would exceed the A100's peak for 70B LoRA:
3497 tok/s x 4.2e11 FLOPs a token = 1.5 PFLOP/s on one 312 TFLOP/s GPU), so they are divided by 8 here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.estimator.config import TrainConfig  # noqa: E402
from meshplan.estimator.hardware import load_hardware  # noqa: E402
from meshplan.estimator.model_spec import load_model  # noqa: E402
from meshplan.estimator.report import estimate  # noqa: E402

TORCHTUNE = ("torchtune README 'Memory and training speed' (meta-pytorch/torchtune #1664): batch 2, packed to 2048 "
             "tokens, compile, AC on; tokens/s over 8 GPUs")
MLP_QVO = ("q", "v", "o", "w1", "w2", "w3")  # torchtune's 70B LoRA configs: q_proj, v_proj, output_proj + the MLP
ALL = ("q", "k", "v", "o", "w1", "w2", "w3")

CASES = [
    {"id": "torchtune-70b-full-offload", "source": TORCHTUNE, "model": "llama3-70b", "hardware": "a100-sxm-80g",
     "gpus": 8, "gpus_per_node": 8, "seq_len": 2048, "global_batch_size": 16, "micro_batch_size": 2, "ac": "full",
     "compile": True, "finetune": "full", "cpu_offload": True,
     "gpu_gib": 13.9, "tps_per_gpu": 1568 / 8,
     "differs": "chunked cross-entropy (no full fp32 logits); fused CPU AdamW"},
    {"id": "torchtune-70b-lora", "source": TORCHTUNE, "model": "llama3-70b", "hardware": "a100-sxm-80g",
     "gpus": 8, "gpus_per_node": 8, "seq_len": 2048, "global_batch_size": 16, "micro_batch_size": 2, "ac": "full",
     "compile": True, "finetune": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_targets": MLP_QVO,
     "gpu_gib": 27.6, "tps_per_gpu": 3497 / 8, "differs": "chunked cross-entropy"},
    {"id": "peft-70b-qlora-offload", "model": "llama2-70b", "hardware": "l40s", "gpus": 2, "gpus_per_node": 2,
     "source": "Hugging Face PEFT docs, accelerate/fsdp.md: Llama-2-70B QLoRA + FSDP on 2 x 24 GB, r 8, all-linear, "
               "seq 2048, batch 2 x 2 accumulation, gradient checkpointing, CPU offload",
     "seq_len": 2048, "global_batch_size": 8, "micro_batch_size": 2, "ac": "full", "finetune": "qlora",
     "lora_rank": 8, "lora_alpha": 16, "lora_targets": ALL, "cpu_offload": True,
     "gpu_gib": 19.6, "host_gib": 107, "differs": "FSDP1 + bitsandbytes 4-bit (bf16 storage); 'GB' as published"},
    {"id": "hf-blog-70b-qlora-offload", "model": "llama3-70b", "hardware": "l40s", "gpus": 4, "gpus_per_node": 4,
     "source": "philschmid, 'Efficiently fine-tune Llama 3 with PyTorch FSDP and Q-Lora': 4 x A10G 24 GB, seq 3072, "
               "batch 1 x 2 accumulation, CPU offload: 22 GB/GPU and 127 GB CPU RAM",
     "seq_len": 3072, "global_batch_size": 8, "micro_batch_size": 1, "ac": "full", "finetune": "qlora",
     "lora_rank": 16, "lora_alpha": 32, "lora_targets": ALL, "cpu_offload": True,
     "gpu_gib": 22, "host_gib": 127, "differs": "FSDP1 + bitsandbytes; rank not stated (16 assumed); 'GB' as published"},
    {"id": "answerai-70b-qlora-offload", "model": "llama2-70b", "hardware": "l40s", "gpus": 2, "gpus_per_node": 2,
     "source": "Answer.AI fsdp_qlora benchmarks_03_2024.md: Llama-2-70B QLoRA on 2 x 3090, context 2048, batch 2, "
               "CPU offload: 14.92 GiB peak",
     "seq_len": 2048, "global_batch_size": 4, "micro_batch_size": 2, "ac": "full", "finetune": "qlora",
     "lora_rank": 64, "lora_alpha": 16, "lora_targets": ALL, "cpu_offload": True,
     "gpu_gib": 14.92, "differs": "activation offloading to the CPU as well (not modelled); bitsandbytes"},
]
# the same PEFT run without offload: "When disabling CPU offloading, the GPU memory usage is 35.6 GB/GPU"
PEFT = next(c for c in CASES if c["id"] == "peft-70b-qlora-offload")
CASES.insert(CASES.index(PEFT) + 1, {
    **{k: v for k, v in PEFT.items() if k not in ("cpu_offload", "host_gib")}, "id": "peft-70b-qlora",
    "gpu_gib": 35.6, "source": "the same PEFT page, CPU offloading disabled",
})
CONFIG_KEYS = ("gpus", "gpus_per_node", "seq_len", "global_batch_size", "micro_batch_size", "ac", "compile",
               "finetune", "lora_rank", "lora_alpha", "lora_targets", "cpu_offload")


def predict(case: dict) -> dict:
    cfg = TrainConfig(dp_shard=-1, **{k: case[k] for k in CONFIG_KEYS if k in case})
    est = estimate(load_model(case["model"]), load_hardware(case["hardware"]), cfg)
    mem, thr = est["memory"], est["throughput"]
    out = {"id": case["id"], "peak_gib": mem["peak_gib"], "allocated_gib": mem["allocated_gib"],
           "host_gib_per_node": mem["host_ram_gib_per_node"], "tps_per_gpu": thr["tokens_per_sec_per_gpu"],
           "published": {k: case[k] for k in ("gpu_gib", "host_gib", "tps_per_gpu") if k in case},
           "differs": case["differs"], "source": case["source"]}
    out["errors"] = {
        "gpu_reserved": mem["peak_gib"] / case["gpu_gib"] - 1,
        "gpu_allocated": mem["allocated_gib"] / case["gpu_gib"] - 1,
        **({"host": mem["host_ram_gib_per_node"] / case["host_gib"] - 1} if "host_gib" in case else {}),
        **({"tps": thr["tokens_per_sec_per_gpu"] / case["tps_per_gpu"] - 1} if "tps_per_gpu" in case else {}),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON list")
    args = ap.parse_args()
    rows = [predict(c) for c in CASES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| run | GPU GiB pred reserved / allocated / published | host GiB/node pred / published | "
          "tok/s/GPU pred / published | differs |")
    print("|---|---|---|---|---|")
    for r in rows:
        p, e = r["published"], r["errors"]
        gpu = (f"{r['peak_gib']:.1f} / {r['allocated_gib']:.1f} / {p['gpu_gib']:g} "
               f"({e['gpu_reserved']:+.0%} / {e['gpu_allocated']:+.0%})")
        host = f"{r['host_gib_per_node']:,.0f} / {p['host_gib']:g} ({e['host']:+.0%})" if "host" in e else "-"
        tps = f"{r['tps_per_gpu']:,.0f} / {p['tps_per_gpu']:,.0f} ({e['tps']:+.0%})" if "tps" in e else "-"
        print(f"| {r['id']} | {gpu} | {host} | {tps} | {r['differs']} |")


if __name__ == "__main__":
    main()

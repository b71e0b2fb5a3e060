"""Fine-tuning on one rank: which weights train and how each is stored, LoRA's adapters, QLoRA's NF4 base, and
FSDP2's CPU offload (bytes, seconds).

- full fine-tuning trains every weight, as pre-training does (16 bytes a parameter: fp32 master, fp32 gradient,
  AdamW's two fp32 moments); it differs in what it loads first (host.py).
- LoRA (torchtune's recipes, torchtitan 0.3's LoRAConverter) freezes the base weights in bf16 (2 bytes, no
  gradient, no optimizer state) and trains, on each targeted linear W (in x out), A (r x in) and B (out x r) in
  fp32 with AdamW; its forward adds x A^T B^T. A frozen linear's backward computes the input gradient only.
- QLoRA stores the frozen linears in NF4 (torchao's `to_nf4`: 4-bit codes, an int8 scale per 64 values, a bf16
  scale per 256 of those: 0.515747 bytes a parameter), the embeddings, output and norms in bf16; every forward and
  backward dequantizes each linear's whole weight to bf16 before its GEMM (torchao's `linear_nf4`).
- CPU offload (FSDP2's CPUOffloadPolicy) keeps the sharded parameters (pinned), gradients and optimizer state on the
  host: each all-gather first copies the rank's shard host-to-device in its stored dtype, each reduce-scatter's
  output goes device-to-host, and AdamW runs on the CPU against the node's DRAM bandwidth.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from meshplan.estimator import xp
from meshplan.estimator.config import LORA_TARGETS
from meshplan.estimator.errors import ConfigError
from meshplan.estimator.hardware import HardwareProfile
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.layout import Layout
from meshplan.estimator.physics.shapes import RankParams
from meshplan.estimator.physics.state import BF16, GRAD_BYTES, state_bytes
from meshplan.estimator.stack import StackProfile

NF4_BYTES = 0.5 + 1 / 64 + 2 / (64 * 256)  # codes + int8 block scale + bf16 scale of 256 scales (torchao to_nf4)
# the host AdamW of CPU offload, bytes a parameter: reads and writes p, m, v (fp32) and reads g (32), the grad norm (4)
ADAMW_STEP_BYTES = 36.0


def linear_shapes(model: ModelSpec) -> Mapping[str, tuple[float, float]]:
    """(in, out) of each LoRA-targetable linear of a dense block (attention q, k, v, o; MLP w1, w2 and, gated, w3);
    read-only (one mapping per block shape, shared)."""
    return _shapes(*_block(model))


def _block(model: ModelSpec) -> tuple[int, int, int, int, int, bool]:
    """What a dense block's linear shapes depend on: the key of their caches (`_shapes`, `_sizes`)."""
    return model.hidden, model.q_dim, model.kv_dim, model.v_dim, model.ffn_hidden, model.gated_mlp


@functools.lru_cache(maxsize=256)
def _shapes(hidden: int, q_dim: int, kv_dim: int, v_dim: int, ffn: int, gated: bool
            ) -> Mapping[str, tuple[float, float]]:
    h, q, kv, f = float(hidden), float(q_dim), float(kv_dim), float(ffn)
    out = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (float(v_dim), h), "w1": (h, f), "w2": (f, h)}
    if gated:
        out["w3"] = (h, f)
    return MappingProxyType(out)


def targets_of(mask: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(target name, whether each configuration targets it) for every LORA_TARGETS entry."""
    return [(name, (mask >> i) & 1 == 1) for i, name in enumerate(LORA_TARGETS)]


def adapter_params_per_layer(model: ModelSpec, lay: Layout) -> np.ndarray:
    """LoRA parameters of one block: r x (in + out) per targeted linear (0 without LoRA)."""
    total = xp.zeros_like(lay.tp)
    if not xp.any_(lay.lora):  # no row trains adapters: skip the per-linear walk (a single estimate's fast path)
        return total
    shapes = linear_shapes(model)
    for name, on in targets_of(lay.c.lora_targets):
        if name in shapes:  # w3 only exists in a gated MLP
            k, n = shapes[name]
            total = total + xp.where(on, lay.lora_rank * (k + n), 0.0)
    return xp.where(lay.lora, total, 0.0)


def adapter_params(model: ModelSpec, rank: int, targets) -> int:
    """LoRA parameters of the whole model for rank `rank` on the linears named in `targets` (every block)."""
    shapes = linear_shapes(model)
    return model.layers * sum(rank * int(k + n) for name, (k, n) in shapes.items() if name in set(targets))


def block_linear_params(model: ModelSpec) -> float:
    """Weights of a dense block's linears (what QLoRA stores in NF4): attention and MLP matrices, no biases."""
    return _sizes(*_block(model))[0]


@functools.lru_cache(maxsize=256)
def _sizes(*block: int) -> tuple[float, float]:
    """(every linear's weights, the largest one's) of a block's linears (`_block`'s values)."""
    sizes = [k * n for k, n in _shapes(*block).values()]
    return float(sum(sizes)), max(sizes)


def first_block_unsaved(model: ModelSpec, lay: Layout, attention_none: np.ndarray) -> np.ndarray:
    """Bytes per token the first block does not save under LoRA without AC: its input comes from the frozen
    embedding and needs no gradient, so its attention norm keeps nothing (2 h); with no attention linear adapted
    nothing in the attention needs a gradient at all (`attention_none`, the attention part's saved bytes, its norm
    included) and neither does the MLP norm's input (2 h). 0 otherwise (op-SAC's policy saves regardless)."""
    h = float(model.hidden)
    targets = dict(targets_of(lay.c.lora_targets))
    attention = targets["q"] | targets["k"] | targets["v"] | targets["o"]
    free = xp.where(attention, 2 * h, attention_none + 2 * h)
    return xp.where(lay.lora & xp.logical_not(lay.full_ac) & xp.logical_not(lay.selective_ac), free, 0.0)


def mm_sequence(model: ModelSpec) -> list[tuple[str, float]]:
    """A dense block's linears in the order its forward runs their matmuls (attention q, k, v, o; MLP w1, w3, w2,
    as torchtitan's and the core's Llama), with each one's output width."""
    shapes = linear_shapes(model)
    order = ["q", "k", "v", "o", "w1", "w3", "w2"] if model.gated_mlp else ["q", "k", "v", "o", "w1", "w2"]
    return [(name, shapes[name][1]) for name in order]


def lora_saved_delta(model: ModelSpec, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per token per block LoRA adds to what is saved for backward without AC, with op-level SAC).

    Without AC: each targeted linear's A output (r wide, bf16) for B's weight gradient, less the inputs that only
    frozen linears read (a frozen linear's matmul saves its weight, not its input: the attention norm's output when
    none of q, k, v is targeted, the attention output's copy wo reads when o is not, the MLP norm's output when
    neither w1 nor w3 is, w2's input when w2 is not).
    With op-SAC (torchtitan's policy: every matmul output saved except every second one, counted in forward order)
    the adapters' matmuls join the count: base, A, B of each targeted linear, which moves the parity of what
    follows; the difference of the saved outputs of the two sequences is what LoRA adds."""
    if not xp.any_(lay.lora):
        return xp.zeros_like(lay.tp), xp.zeros_like(lay.tp)
    seq = mm_sequence(model)
    h, F, q = float(model.hidden), float(model.ffn_hidden), float(model.q_dim)
    r = lay.lora_rank
    targets = dict(targets_of(lay.c.lora_targets))
    none = xp.zeros_like(lay.tp)
    for name, _ in seq:
        none = none + xp.where(targets[name], 2 * r, 0.0)
    qkv = targets["q"] | targets["k"] | targets["v"]
    up = targets["w1"] | (targets["w3"] if model.gated_mlp else False)
    none = (none - xp.where(qkv, 0.0, 2 * h) - xp.where(targets["o"], 0.0, 2 * q) - xp.where(up, 0.0, 2 * h)
            - xp.where(targets["w2"], 0.0, 2 * F))
    # op-SAC: walk the matmuls with a per-configuration counter (odd counts saved)
    count = xp.zeros_like(lay.tp)
    dense_saved = sum(2 * width for i, (_, width) in enumerate(seq) if i % 2 == 0)  # counts 1, 3, 5, 7 saved
    lora_saved = xp.zeros_like(lay.tp)
    for name, width in seq:
        on = targets[name]
        for w, present in ((width, True), (r, on), (width, on)):  # base, A (r wide), B
            present = present | xp.zeros_like(lay.tp, dtype=np.bool_)
            count = count + present
            lora_saved = lora_saved + xp.where(present & (count % 2 == 1), 2 * w, 0.0)
    return xp.where(lay.lora, none, 0.0), xp.where(lay.lora, lora_saved - dense_saved, 0.0)


@dataclass(frozen=True)
class Weights:
    """What a stage's rank trains and freezes (float arrays; counts before FSDP unless named bytes)."""

    adapters_block: np.ndarray  # LoRA parameters of one block (0 without LoRA)
    adapters: np.ndarray  # LoRA parameters of the rank's blocks
    frozen_bytes_per_param: np.ndarray  # storage of a frozen base parameter (bf16, or NF4's mix for QLoRA)
    block_gather_bytes_per_param: np.ndarray  # what FSDP all-gathers per parameter of a block (bf16; QLoRA: NF4 mix)
    dequant_bf16_bytes: np.ndarray  # QLoRA: the largest linear's dequantized bf16 weight, live around its GEMM

    def trainable(self, lay: Layout, base: np.ndarray) -> np.ndarray:
        """Trainable parameters of a rank holding `base` base parameters: the adapters under LoRA, else `base`."""
        return xp.where(lay.lora, self.adapters, base)

    def frozen(self, lay: Layout, base: np.ndarray) -> np.ndarray:
        """Frozen parameters of that rank: every base parameter under LoRA, none otherwise."""
        return xp.where(lay.lora, base, 0.0)


def weights(model: ModelSpec, lay: Layout, rp: RankParams) -> Weights:
    """The rank's trainable and frozen weights for every configuration (QLoRA: a block's linears in NF4, its norms
    and the root's embedding and output in bf16, as torchtune's QLoRA builders leave them)."""
    per_layer = adapter_params_per_layer(model, lay)
    linears = block_linear_params(model) / lay.tp
    block_share = xp.minimum(1.0, linears / xp.maximum(rp.block, 1.0))
    stage_share = xp.minimum(1.0, rp.layers * linears / xp.maximum(rp.most, 1.0))
    largest = _sizes(*_block(model))[1]
    return Weights(
        adapters_block=per_layer, adapters=rp.layers * per_layer,
        frozen_bytes_per_param=xp.where(lay.qlora, stage_share * NF4_BYTES + (1 - stage_share) * BF16, BF16),
        block_gather_bytes_per_param=xp.where(lay.qlora, block_share * NF4_BYTES + (1 - block_share) * BF16, BF16),
        dequant_bf16_bytes=xp.where(lay.qlora, BF16 * largest / lay.tp, 0.0),
    )


@dataclass(frozen=True)
class StageState:
    """Bytes of a stage rank's weights and optimizer state, where they live (GPU or host)."""

    params_bytes: np.ndarray  # trainable fp32 master weights on the GPU (sharded)
    grads_bytes: np.ndarray  # trainable fp32 gradients on the GPU (sharded)
    optimizer_bytes: np.ndarray  # AdamW moments on the GPU (sharded)
    frozen_bytes: np.ndarray  # frozen base weights on the GPU (sharded; bf16 or NF4)
    host_bytes: np.ndarray  # the same four on the host under CPU offload (pinned), 0 without
    trainable_sharded: np.ndarray  # trainable parameters after FSDP (the optimizer's and the D2H's work)
    stored_sharded_bytes: np.ndarray  # the rank's shard of every weight as stored (what offload copies H2D)
    bucket_bytes: np.ndarray | float = 0.0  # of grads_bytes, DDP's buckets (on the GPU from the first forward on)


def stage_state(w: Weights, lay: Layout, rp: RankParams, base: np.ndarray, stack: StackProfile | None = None
                ) -> StageState:
    """State of a rank of a stage holding `base` base parameters (TP-sharded, before FSDP). Without FSDP the
    stack's replicated state applies (:func:`~meshplan.estimator.physics.state.state_bytes`)."""
    train = rp.sharded(w.trainable(lay, base), lay)
    frozen = w.frozen(lay, base) / lay.fsdp_ranks
    per = state_bytes(stack, lay)  # bytes a trainable parameter (training.dtype bfloat16: half)
    params, grads, optim = per.params * train, per.grads * train, per.optimizer * train
    frozen_b = w.frozen_bytes_per_param * frozen
    on_gpu = xp.where(lay.offload, 0.0, 1.0)
    return StageState(
        params_bytes=params * on_gpu, grads_bytes=grads * on_gpu, optimizer_bytes=optim * on_gpu,
        frozen_bytes=frozen_b * on_gpu, host_bytes=xp.where(lay.offload, params + grads + optim + frozen_b, 0.0),
        trainable_sharded=train, stored_sharded_bytes=params + frozen_b, bucket_bytes=per.buckets * train * on_gpu,
    )


# --- time ------------------------------------------------------------------------------------------------------
def lora_gemm_s(model: ModelSpec, hw: HardwareProfile, stack: StackProfile, lay: Layout, gemm_s) -> np.ndarray:
    """Forward + backward seconds of one block's LoRA matmuls per microbatch: x A^T (in -> r) and its B^T (r -> out)
    on each targeted linear, in bf16 (skinny: r is their narrow dimension)."""
    total = xp.zeros_like(lay.tp)
    if not xp.any_(lay.lora):
        return total
    shapes = linear_shapes(model)
    for name, on in targets_of(lay.c.lora_targets):
        if name not in shapes:
            continue
        k, n = shapes[name]
        _, a = gemm_s(hw, stack, lay, k, lay.lora_rank)
        _, b = gemm_s(hw, stack, lay, lay.lora_rank, n)
        total = total + xp.where(on, a + b, 0.0)
    return xp.where(lay.lora, total, 0.0)


def dequant_s(model: ModelSpec, stack: StackProfile, lay: Layout, hbm_bytes_per_s: float,
              passes: np.ndarray) -> np.ndarray:
    """QLoRA: seconds to dequantize one block's NF4 linears to bf16 `passes` times (forward, backward, recompute):
    memory-bound at the stack's bytes per parameter of torchao's NF4 dequantization."""
    ft = finetune_behaviour(model, stack, lay)
    per_param = ft.nf4_dequant_bytes_per_param if ft is not None else 0.0
    return xp.where(lay.qlora, passes * block_linear_params(model) / lay.tp * per_param / hbm_bytes_per_s, 0.0)


def host_link_bytes_per_s(hw: HardwareProfile) -> float:
    if hw.host_link_gbs is None:
        raise ConfigError(f"hardware profile '{hw.id}' states no host link bandwidth (host_link_gbs): CPU offload "
                          "cannot be timed; add it to the profile")
    return hw.host_link_gbs * 1e9


def offload_transfer_s(hw: HardwareProfile, lay: Layout, st: StageState, gathers: np.ndarray) -> np.ndarray:
    """Per microbatch: the shard copied host-to-device before each of its `gathers` all-gathers (stored dtype), and
    the trainable gradients' shard device-to-host after the reduce-scatter (fp32); 0 without offload."""
    if not xp.any_(lay.offload):
        return xp.zeros_like(lay.tp)
    link = host_link_bytes_per_s(hw)
    return xp.where(lay.offload, (gathers * st.stored_sharded_bytes + GRAD_BYTES * st.trainable_sharded) / link, 0.0)


def cpu_optimizer_s(hw: HardwareProfile, stack: StackProfile, lay: Layout, trainable_sharded: np.ndarray) -> np.ndarray:
    """AdamW on the host over the rank's trainable shard: memory-bound on the node's DRAM, which its ranks share,
    at the stack's CPU optimizer efficiency."""
    if not xp.any_(lay.offload):
        return xp.zeros_like(lay.tp)
    return ADAMW_STEP_BYTES * trainable_sharded / host_bytes_per_s_per_rank(hw, stack, lay)


def host_bytes_per_s_per_rank(hw: HardwareProfile, stack: StackProfile, lay: Layout) -> np.ndarray:
    """What one rank's CPU-side optimizer work gets of the node's DRAM bandwidth (shared by the node's ranks, at the
    stack's CPU optimizer efficiency), bytes/s."""
    if hw.host_memory_bandwidth_gbs is None:
        raise ConfigError(f"hardware profile '{hw.id}' states no host memory bandwidth (host_memory_bandwidth_gbs): "
                          "the CPU optimizer step of CPU offload cannot be timed; add it to the profile")
    ft = stack.finetune
    eff = ft.cpu_optimizer_efficiency if ft is not None else 1.0
    return hw.host_memory_bandwidth_gbs * 1e9 * eff / xp.minimum(lay.gpus_per_node, lay.world)


def offload_accumulate_s(hw: HardwareProfile, stack: StackProfile, lay: Layout, st: StageState) -> np.ndarray:
    """CPU offload with gradient accumulation, per microbatch after the first: FSDP2 copies the reduced gradient
    shard device-to-host synchronously (fp32) and adds it to the host gradient on the CPU (read two, write one)."""
    if not xp.any_(lay.offload):
        return xp.zeros_like(lay.tp)
    d2h = GRAD_BYTES * st.trainable_sharded / host_link_bytes_per_s(hw)
    add = 3 * GRAD_BYTES * st.trainable_sharded / host_bytes_per_s_per_rank(hw, stack, lay)
    return xp.where(lay.offload, d2h + add, 0.0)


def flops_per_token(model: ModelSpec, lay: Layout, dense_flops: np.ndarray) -> np.ndarray:
    """Model FLOPs per token of a step: `dense_flops` (torchtitan's 6 N + attention) unless LoRA freezes the base,
    whose linears then skip their weight gradients (4 N instead of 6 N) while the adapters train (6 a)."""
    if not xp.any_(lay.lora):
        return dense_flops
    n = model.flops_per_token(1)  # 6 (N_active - N_embedding)
    adapters = 6.0 * float(model.layers) * adapter_params_per_layer(model, lay)
    return xp.where(lay.lora, dense_flops - n / 3.0 + adapters, dense_flops)


def finetune_behaviour(model: ModelSpec, stack: StackProfile, lay: Layout):
    """The stack's fine-tuning behaviour where a configuration needs it; ConfigError when the stack has none."""
    if xp.any_(lay.lora | lay.offload) and stack.finetune is None:
        raise ConfigError(f"stack profile '{stack.id}' does not describe LoRA / QLoRA fine-tuning or CPU offload "
                          "(use the torchtitan stack)")
    return stack.finetune

"""Run-config validation, one-line early errors for CUDA-only requests on CPU, Float8 layer choice, data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from launchtools import ROOT, TINY_MODEL, child_env, config
from needs import require_module

from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.data import ShardedLoader, TokenSource
from meshplan.launcher.core.parallelize import check_environment, float8_filter, stage_ids, stage_layers
from meshplan.launcher.core.train import adamw_implementation

NO_CUDA = not torch.cuda.is_available()


def run_entry_point(config_path, timeout: float) -> subprocess.CompletedProcess:
    """`python -m meshplan.launcher.core.train --config PATH` as one process (world 1); `timeout` in seconds."""
    return subprocess.run(
        [sys.executable, "-m", "meshplan.launcher.core.train", "--config", str(config_path)],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout,
    )


def make(**overrides) -> RunConfig:
    return RunConfig.from_dict(config("/tmp/unused", **overrides))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tp": 4, "model": {**TINY_MODEL, "kv_heads": 2}}, "tp 4 does not divide the 4 attention heads, 2 KV heads"),
        ({"vpp": 2}, "pp schedule 1F1B with vpp 2"),
        ({"pp": 2, "pp_schedule": "Interleaved1F1B"}, "(Interleaved1F1B, InterleavedZeroBubble) take 2 or more stages"),
        ({"pp": 2, "vpp": 2, "pp_schedule": "InterleavedZeroBubble", "compile": True},
         "InterleavedZeroBubble splits each backward into its input and weight gradients"),
        ({"dp_shard": 3}, "global batch 8 does not divide into dp 3 x micro-batch 2"),
        ({"pp": 8, "vpp": 1}, "pp 8 x vpp 1 = 8 stages exceed the 4 layers"),
        ({"cp": 2, "seq_len": 30}, "cp 2 does not divide seq_len 30"),
        ({"pp_schedule": "Zero Bubble"}, "pp_schedule"),
        ({"async_tp": True, "tp": 2}, "async TP is a torch.compile pass: it needs compile on"),
        ({"pp": 4, "global_batch_size": 4}, "2 microbatches per step < pp 4"),
        ({"pp": 2, "pp_last_stage_less_layers": 6}, "pp_last_stage_less_layers 6 exceeds 5, the layers each of the 2"),
        ({"pp": 2, "pp_first_stage_less_layers": -1}, "pp_first_stage_less_layers"),
        ({"tp": 2, "model": {**TINY_MODEL, "vocab": 255}}, "tp 2 does not divide the vocabulary (255)"),
        ({"tp": 2, "model": {**TINY_MODEL, "tied_embeddings": True}}, "ties its input and output embeddings"),
    ],
)
def test_invalid_configs_fail_with_one_line(overrides, message):
    with pytest.raises(ValueError) as err:
        make(**overrides)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_world_size_must_match_degrees():
    cfg = make(dp_shard=2, tp=2)
    cfg.check_world(4)
    with pytest.raises(ValueError, match=r"= 4, but WORLD_SIZE is 2"):
        cfg.check_world(2)


def test_model_preset_name_resolves():
    cfg = RunConfig.from_dict({"model": "llama3-8b", "seq_len": 128})
    assert cfg.model.layers == 32 and cfg.model.kv_heads == 8


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only failure messages")
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"device": "cuda"}, "device 'cuda' requested but this machine has no usable CUDA GPU"),
        ({"backend": "nccl"}, "backend 'nccl' needs device 'cuda'"),
        ({"async_tp": True, "compile": True, "tp": 2}, "async_tp needs CUDA GPUs"),
        ({"float8": "mxfp8"}, "float8 'mxfp8' needs a Blackwell GPU"),
        ({"float8": "tensorwise", "tp": 2}, "float8 tensorwise with tp > 1 all-gathers float8 tensors"),
    ],
)
def test_cuda_only_requests_fail_early_on_cpu(overrides, message):
    with pytest.raises(RuntimeError, match=message):
        check_environment(make(**overrides))


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only failure message")
def test_entry_point_reports_cuda_request_in_one_line(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config(tmp_path / "run", device="cuda")))
    proc = run_entry_point(path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: device 'cuda' requested but this machine has no usable CUDA GPU (torch.cuda.is_available() "
        "is False); use device: cpu"
    ]


def test_float8_converts_block_linears_but_not_output():
    from torchao.float8.float8_linear import Float8Linear

    from meshplan.launcher.core.model import build_meta_model
    from meshplan.launcher.core.parallelize import convert_float8

    model = build_meta_model(make().model.model_copy(update={"vocab": 250}), seq_len=32)
    convert_float8(model, "tensorwise")
    converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    per_block = {
        f"layers.{i}.{s}"
        for i in range(4)
        for s in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
        )
    }
    assert converted == per_block
    assert "output" in linears and "output" not in converted
    assert not float8_filter(torch.nn.Linear(64, 250), "layers.0.x")  # not divisible by 16


def test_pipeline_stage_assignment():
    # torchtitan's split: 5 layers + 1 (embedding) + 1 (output) = 7 over 4 stages = 2, 2, 2, 1 layer units, less the
    # embedding's on the first and the output's on the last; with both weights 0 the first stage takes the extra
    assert stage_layers(5, 4) == [[0], [1, 2], [3, 4], []]
    assert stage_layers(5, 4, 0, 0) == [[0, 1], [2], [3], [4]]
    assert [len(s) for s in stage_layers(80, 8)] == [10, 11, 10, 10, 10, 10, 10, 9]
    cfg = make(pp=2, vpp=2, pp_schedule="Interleaved1F1B")
    assert stage_ids(cfg, 0) == [0, 2] and stage_ids(cfg, 1) == [1, 3]


def test_data_shards_partition_the_global_batch_and_resume(tmp_path):
    src = TokenSource("synthetic", vocab=256, seq_len=16, seed=3)
    full = ShardedLoader(src, global_batch=8, dp_rank=0, dp_size=1)
    shards = [ShardedLoader(src, global_batch=8, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(2):
        assert torch.equal(full.next_batch(), torch.cat([s.next_batch() for s in shards]))
    resumed = ShardedLoader(src, global_batch=8, dp_rank=0, dp_size=1)
    resumed.load_state_dict(full.state_dict())
    assert torch.equal(resumed.next_batch(), full.next_batch())
    text = tmp_path / "t.txt"
    text.write_text("hello world, " * 20)
    batch = ShardedLoader(TokenSource(str(text), 256, 16, 0), 2, 0, 1).next_batch()
    assert batch.shape == (2, 17) and bytes(batch[0].tolist()).decode().startswith("hello world")


def test_text_file_training_entry_point_single_process(tmp_path):
    """A plain `python -m meshplan.launcher.core.train` run (world 1) on a local text file learns and logs metrics."""
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    cfg = config(tmp_path / "run", data=str(text), steps=12, lr=3e-3, warmup_steps=2)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg))
    proc = run_entry_point(path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 13))
    for key in ("loss", "tokens_per_sec_per_gpu", "step_time_s", "peak_mem_gib", "mfu", "grad_norm", "lr"):
        assert key in recs[0]
    assert recs[0]["peak_mem_gib"] > 0 and recs[0]["tokens_per_sec_per_gpu"] > 0
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    assert "step 12/12 | loss" in proc.stdout


def _word_tokenizer(path, text: str) -> int:
    """Write a word-level Hugging Face tokenizer.json for `text`; returns its vocabulary size."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = sorted(set(text.replace(".", " . ").split()))
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return len(vocab)


def test_hf_tokenizer_file_feeds_the_stream_and_trains(tmp_path):
    """A local tokenizer.json replaces the byte tokenizer: the stream holds its ids, and a run learns on them."""
    require_module("tokenizers", "the train extra installs it")
    text = "the quick brown fox jumps over the lazy dog. " * 200
    (tmp_path / "corpus.txt").write_text(text)
    n = _word_tokenizer(tmp_path / "tokenizer.json", text)
    assert n == 10  # 8 distinct words, '.', [UNK]
    src = TokenSource(str(tmp_path / "corpus.txt"), vocab=256, seq_len=16, seed=0,
                      tokenizer=str(tmp_path / "tokenizer.json"))
    assert src.tokens is not None and len(src.tokens) == 10 * 200 and int(src.tokens.max()) < n
    first = src.sample(0).tolist()
    assert len(first) == 17 and first[:7] == first[10:]  # the sentence repeats every 10 word ids
    with pytest.raises(ValueError, match="tokenizer has 10 tokens but the model's vocab is 8"):
        TokenSource(str(tmp_path / "corpus.txt"), vocab=8, seq_len=16, seed=0, tokenizer=str(tmp_path / "tokenizer.json"))

    cfg = config(tmp_path / "run", data=str(tmp_path / "corpus.txt"), tokenizer=str(tmp_path / "tokenizer.json"),
                 steps=8, lr=3e-3, warmup_steps=1)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    proc = run_entry_point(tmp_path / "run.json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0


@pytest.mark.parametrize(
    "overrides, device, expected",
    [
        ({}, "cuda", {"fused": True}),  # torchtitan's default implementation: no full-size temporaries at the step
        ({"dp_shard": 2}, "cuda", {"fused": True}),
        ({"cpu_offload": True, "dp_shard": 2}, "cuda", {"fused": True}),  # steps on the host's fused kernel
        ({"tp": 2}, "cuda", {"foreach": False}),
        ({}, "cpu", {"foreach": False}),
    ],
)
def test_adamw_implementation(overrides, device, expected):
    assert adamw_implementation(make(**overrides), device) == expected

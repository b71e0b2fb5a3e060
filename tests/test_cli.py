"""The `meshplan` command as a user runs it: JSON contract, readable report, one-line errors."""

import json

import pytest

KEYS = [("model", "params"), ("memory", "peak_gib"), ("memory", "usable_gib"), ("memory", "fits"),
        ("memory", "breakdown_gib"), ("memory", "host_ram_gib_per_node"), ("throughput", "tokens_per_sec_per_gpu"),
        ("throughput", "step_time_s"), ("throughput", "mfu"), ("throughput", "breakdown_s")]


def test_estimate_json_contract(cli):
    out = cli("estimate", "--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "8",
              "--dp-shard", "-1", "--seq-len", "8192", "--global-batch-size", "64", "--ac", "full", "--compile",
              "--float8", "tensorwise", "--async-tp", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for a, b in KEYS:
        assert b in data[a]
    assert isinstance(data["model"]["params"], int) and isinstance(data["memory"]["fits"], bool)
    assert 0 < data["throughput"]["mfu"] < 1
    assert isinstance(data["warnings"], list)
    assert data["config"]["dp_shard"] == 8


def test_estimate_defaults_and_report(cli):
    out = cli("estimate")
    assert out.returncode == 0, out.stderr
    assert "tokens/s/GPU" in out.stdout and "peak" in out.stdout and "host RAM" in out.stdout


def test_estimate_pipeline_options(cli):
    out = cli("estimate", "--model", "llama3-405b", "--gpus", "512", "--tp", "8", "--pp", "8", "--pp-schedule",
              "Interleaved1F1B", "--vpp", "2", "--seq-len", "8192", "--global-batch-size", "256", "--ac", "full",
              "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["config"]["vpp"] == 2 and data["throughput"]["breakdown_s"]["pp_bubble"] > 0


def test_estimate_hf_config(cli, tmp_path):
    cfg = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    out = cli("estimate", "--model", str(p), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["params"] > 1e9


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--hardware", "tpu-v9"], "unknown hardware profile 'tpu-v9'"),
        (["--gpus", "16", "--tp", "4", "--dp-shard", "2"], "degrees multiply to 8"),
        (["--gpus", "8", "--tp", "8", "--model", "llama2-7b", "--seq-len", "4096"], None),  # valid: 32 heads
        (["--gpus", "16", "--tp", "16"], "tp 16 does not divide the 32 attention heads, 8 KV heads"),
        (["--seq-len", "0"], "--seq-len"),
        (["--seq-len", "-5"], "--seq-len"),
        (["--micro-batch-size", "0"], "--micro-batch-size"),
        (["--gpus", "8", "--global-batch-size", "12", "--micro-batch-size", "1"], "does not divide"),
        (["--gpus", "16", "--pp", "2", "--global-batch-size", "8"], None),  # predicted: it runs, the bubble says why slowly
        (["--hardware", "a100-sxm-80g", "--float8", "tensorwise"], "fp8"),
        (["--async-tp"], "async TP needs tp > 1"),
        (["--tp", "abc"], "--tp"),
        (["--model", "llama3-8b; rm -rf /"], "unknown model"),
        (["--gpus", "12"], "whole number of 8-GPU nodes"),
        (["--pp", "2", "--vpp", "2", "--gpus", "16", "--global-batch-size", "16"], "Interleaved1F1B"),
    ],
)
def test_bad_input_is_one_line(cli, args, needle):
    out = cli("estimate", *args)
    if needle is None:
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert out.stderr.startswith("meshplan: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_malformed_files_are_one_line(cli, tmp_path):
    bad_json = tmp_path / "config.json"
    bad_json.write_text('{"hidden_size": 4096,')
    bad_yaml = tmp_path / "hw.yaml"
    bad_yaml.write_text("id: x\n  bad: [\n")
    for args in (["--model", str(bad_json)], ["--hardware", str(bad_yaml)], ["--model", str(tmp_path / "none.yaml")]):
        out = cli("estimate", *args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_catalog_commands(cli):
    out = cli("models", "--json")
    assert out.returncode == 0 and any(m["name"] == "llama3-405b" for m in json.loads(out.stdout))
    out = cli("hardware", "--json")
    assert out.returncode == 0 and any(h["id"] == "h200-sxm" for h in json.loads(out.stdout))


def test_help_teaches(cli):
    out = cli("estimate", "--help")
    assert out.returncode == 0 and "Example" in out.stdout and "--dp-shard" in out.stdout

"""Bad input through the real CLI: one line on stderr, exit 2, no traceback, and nothing half-written.

Non-UTF-8 files, huge or infinite numbers, huge clusters, bad output paths, and the capacity report's reason
when nothing fits.
"""

from __future__ import annotations

import json
import signal
import time

import pytest


def one_line_error(out, needle: str | None = None) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("meshplan: error: ") and out.stderr.count("\n") == 1, out.stderr
    if needle is not None:
        assert needle in out.stderr, out.stderr
    return out.stderr


HF_CONFIG = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 8192, "vocab_size": 128256}
BINARY = bytes(range(128, 256)) + b"\x00\x01\x02" * 20


@pytest.fixture
def bad_files(tmp_path):
    """Files that are not UTF-8: random bytes under text suffixes, and a UTF-16 config.json / CSV."""
    files = {}
    for name in ("bin.json", "bin.yaml", "bin.csv"):
        files[name] = tmp_path / name
        files[name].write_bytes(BINARY)
    utf16 = tmp_path / "utf16" / "config.json"
    utf16.parent.mkdir()
    utf16.write_text(json.dumps(HF_CONFIG), encoding="utf-16")
    files["utf16.json"] = utf16
    files["utf16.csv"] = tmp_path / "utf16.csv"
    files["utf16.csv"].write_text("id,gpus,seq_len\nr1,8,4096\n", encoding="utf-16")
    return files


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--model", "{bin.json}"],
        ["estimate", "--model", "{utf16.json}"],
        ["estimate", "--hardware", "{bin.yaml}"],
        ["estimate", "--plan", "{bin.yaml}"],
        ["export", "{bin.yaml}", "-f", "torchrun"],
        ["validate", "{bin.csv}"],
        ["validate", "{utf16.csv}"],
        ["plan", "--model", "{bin.json}", "--nodes", "1"],
    ],
)
def test_non_utf8_input_is_one_line(cli, bad_files, args):
    argv = [str(bad_files[a[1:-1]]) if a.startswith("{") else a for a in args]
    err = one_line_error(cli(*argv), "is not UTF-8 text")
    assert str(bad_files[next(a[1:-1] for a in args if a.startswith("{"))]) in err


def test_utf8_with_bom_is_text(cli, tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(HF_CONFIG).encode())
    out = cli("estimate", "--model", str(p), "--json")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("exc", [OverflowError("Python int too large to convert to C long"),
                                 UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")])
def test_cli_safety_net_turns_overflow_and_decode_errors_into_one_line(monkeypatch, capsys, exc):
    """An OverflowError or UnicodeDecodeError that a command did not turn into a MeshplanError still ends as
    one line and exit 2 (meshplan.cli.main), not a traceback."""
    from meshplan import cli as cli_module
    from meshplan.commands import estimate as estimate_module

    def boom(*_a, **_k):
        raise exc

    monkeypatch.setattr(estimate_module, "load_hardware", boom)
    with pytest.raises(SystemExit) as done:
        cli_module.main(["estimate", "--model", "llama3-8b"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["estimate", "--seq-len", "99999999999999999999"], "--seq-len 99,999,999,999,999,999,999 is too large"),
        (["estimate", "--gpus", "99999999999999999999"], "--gpus"),
        (["estimate", "--tp", "99999999999999999999"], "--tp"),
        (["estimate", "--dp-shard", "99999999999999999999", "--gpus", "8"], "--dp-shard"),
        (["estimate", "--global-batch-size", "99999999999999999999"], "--global-batch-size"),
        (["estimate", "--tokens", "1e400", "-o", "{tmp}/p.yaml"], "finite token count"),
        (["estimate", "--tokens", "inf", "-o", "{tmp}/p.yaml"], "finite token count"),
        (["estimate", "--tokens", "1e30", "-o", "{tmp}/p.yaml"], "too large"),
        (["plan", "--model", "llama3-8b", "--nodes", "1", "--tokens", "inf"], "finite token count"),
        (["plan", "--model", "llama3-8b", "--nodes", "1", "--seq-len", "99999999999999999999"], "--seq-len"),
        (["capacity", "--model", "llama3-8b", "--tokens", "inf", "--hardware", "h100-sxm", "--nodes", "1"],
         "finite token count"),
        (["capacity", "--model", "llama3-8b", "--tokens", "1e12", "--hardware", "h100-sxm", "--nodes", "1",
          "--price", "inf"], "--price must be a finite number"),
    ],
)
def test_huge_and_infinite_numbers_are_one_line(cli, tmp_path, args, needle):
    out = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    err = one_line_error(out, needle)
    assert "inf days" not in out.stdout and "$inf" not in out.stdout, out.stdout
    assert "OverflowError" not in err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("command", ["plan", "capacity"])
def test_huge_cluster_errors_fast(cli, command):
    extra = ["--tokens", "1e12", "--hardware", "h100-sxm"] if command == "capacity" else []
    start = time.monotonic()
    out = cli(command, "--model", "llama3-8b", "--nodes", "100000000", *extra, timeout=60)
    assert time.monotonic() - start < 60
    one_line_error(out, "--nodes 100,000,000 is too large (at most 100,000)")


def test_divisors_are_fast_and_exact():
    from meshplan.planner.space import _divisors

    for n in (1, 2, 12, 36, 97, 360, 1024, 999_983 * 2):
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]

    def too_slow(*_):
        raise TimeoutError("divisor enumeration is not O(sqrt n)")

    old = signal.signal(signal.SIGALRM, too_slow)  # a linear loop must fail the test, not hang it
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        big = _divisors(2**20 * 3**10 * 5**2)  # ~1.5e12: the old loop would never finish
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert big[0] == 1 and big[-1] == 2**20 * 3**10 * 5**2 and len(big) == 21 * 11 * 3


def test_planner_and_tui_share_the_node_bound():
    from meshplan.estimator.limits import MAX_GPUS, MAX_NODES
    from meshplan.ui.tui.form import DEFAULTS, parse_form

    _, errors = parse_form({**DEFAULTS, "nodes": str(MAX_NODES + 1)})
    assert f"1..{MAX_NODES:,}" in errors["nodes"]
    _, errors = parse_form({**DEFAULTS, "nodes": "1e400"})
    assert "nodes" in errors  # inf: an inline error, not an OverflowError
    _, errors = parse_form({**DEFAULTS, "tokens": "1e400"})
    assert "too large" in errors["tokens"]

    from meshplan.estimator import MeshplanError, load_hardware, load_model, load_stack
    from meshplan.planner.search import plan_search

    start = time.monotonic()
    with pytest.raises(MeshplanError, match="world size"):
        plan_search(load_model("llama3-8b"), load_hardware("h100-sxm"), load_stack("torchtitan"), MAX_GPUS * 8, 8,
                    8192, 512)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "output,needle",
    [("{tmp}/missing/p.yaml", "output folder does not exist"), ("{tmp}", "output path is a folder")],
)
def test_plan_checks_every_output_before_writing_any(cli, tmp_path, output, needle):
    csv_path = tmp_path / "sweep.csv"
    out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--csv", str(csv_path), "-o",
              output.replace("{tmp}", str(tmp_path)))
    one_line_error(out, needle)
    assert not csv_path.exists(), "the sweep CSV was written although -o is unusable"


def test_plan_checks_the_name_before_writing_the_csv(cli, tmp_path):
    csv_path = tmp_path / "sweep.csv"
    out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--csv", str(csv_path), "-o",
              str(tmp_path / "p.yaml"), "--name", "gpu;$(touch PWN)")
    one_line_error(out, "--name")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plan_bad_csv_path_writes_no_plan(cli, tmp_path):
    plan_path = tmp_path / "p.yaml"
    out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--csv", str(tmp_path / "no" / "s.csv"), "-o",
              str(plan_path))
    one_line_error(out, "--csv")
    assert not plan_path.exists()


def test_capacity_says_why_nothing_fits(cli):
    out = cli("capacity", "--model", "llama3-405b", "--tokens", "1e12", "--hardware", "l40s", "--nodes", "1")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "smallest cluster that fits on l40s: none tried fits" in text
    assert "why not, at 1 node(s): no configuration of llama3-405b fits on 8 x l40s: the smallest peak is" in text
    assert "GiB >" in text

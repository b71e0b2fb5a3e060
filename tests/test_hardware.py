import pytest

from meshplan.estimator import MeshplanError, load_hardware
from meshplan.estimator.hardware import hardware_names

REQUIRED = {"h100-sxm", "h100-pcie", "h100-nvl", "h100-96g-500w", "h200-sxm", "b200", "gb200", "a100-sxm-40g",
            "a100-sxm-80g", "a100-pcie-80g", "l40s", "mi300x", "mi325x", "h800-sxm", "a800-sxm-80g", "b300", "gb300", "mi355x"}
SOURCED = ("peak_tflops_bf16", "hbm_total_gib", "hbm_bandwidth_tbs", "gpus_per_node", "intra_node_gbs",
           "inter_node_gbps", "efficiency.gemm_bf16", "efficiency.attention")


def test_required_profiles_exist():
    assert REQUIRED <= set(hardware_names())


@pytest.mark.parametrize("name", hardware_names())
def test_profile_is_complete_and_sourced(name):
    hw = load_hardware(name)
    assert hw.id == name
    missing = [f for f in SOURCED if f not in hw.sources]
    assert not missing, f"{name}: no source for {missing}"
    if hw.peak_tflops_fp8:
        assert "peak_tflops_fp8" in hw.sources and hw.efficiency.gemm_fp8
    if hw.price:
        assert "price" in hw.sources and len(hw.price.date) == 10
    assert 0 < hw.usable_hbm_gib < hw.hbm_total_gib


@pytest.mark.parametrize("name", hardware_names())
def test_every_number_is_sourced(name):
    """Every number a built-in profile states, every efficiency the time model uses, and the price (or why
    there is none: "omitted: ...") has an entry in `sources`."""
    from meshplan.estimator import data_files

    raw = data_files.read_yaml(data_files.data_dir("hardware_profiles") / f"{name}.yaml")
    hw = load_hardware(name)
    numbers = [k for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    numbers += [f"efficiency.{k}" for k, v in hw.efficiency.model_dump().items() if v is not None]
    missing = [f for f in [*numbers, "price"] if not hw.sources.get(f, "").strip()]
    assert not missing, f"{name}: add sources for {missing} (cite shared/reference/hardware_facts.md keys)"
    if hw.price is None:
        assert hw.sources["price"].startswith("omitted:"), f"{name}: say why there is no price ('omitted: ...')"


def test_user_profile_by_path(tmp_path):
    text = (tmp_path.parent / "x").name  # unused; keep tmp_path in use
    del text
    src = load_hardware("h100-sxm").model_dump()
    src.update(id="my-h100", hbm_total_gib=60.0)
    import yaml

    p = tmp_path / "my-h100.yaml"
    p.write_text(yaml.safe_dump(src))
    hw = load_hardware(str(p))
    assert hw.id == "my-h100" and hw.usable_hbm_gib == pytest.approx(59.0)


@pytest.mark.parametrize(
    "text,needle",
    [("id: x\nname: [unclosed\n", "not valid YAML"), ("id: x\n", "invalid hardware profile"), ("3\n", "mapping")],
)
def test_bad_profile(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(MeshplanError, match=needle):
        load_hardware(str(p))


def test_unknown_hardware():
    with pytest.raises(MeshplanError, match="unknown hardware profile 'tpu9'"):
        load_hardware("tpu9")


@pytest.mark.parametrize(("name", "hw_id"), [
    ("H100", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("h100_80gb", "h100-sxm"), ("H100 SXM5", "h100-sxm"),
    ("NVIDIA H200", "h200-sxm"), ("A100-SXM4-40GB", "a100-sxm-40g"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80g"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("AMD Instinct MI300X", "mi300x"), ("B200", "b200"),
    ("NVIDIA H100 SXM5 80GB", "h100-sxm"),  # the profile's own name
    ("H800", "h800-sxm"), ("NVIDIA H800 80GB HBM3", "h800-sxm"), ("A800-SXM4-80GB", "a800-sxm-80g"),
    ("NVIDIA B300 SXM6 AC", "b300"), ("MI355X", "mi355x"), ("NVIDIA GB300", "gb300"), ("GB300 NVL72", "gb300"),
])
def test_a_part_is_found_by_the_names_runs_and_tools_give_it(name, hw_id):
    """nvidia-smi / rocm-smi device names and the short names of run logs find the profile (`aliases`)."""
    assert load_hardware(name).id == hw_id


@pytest.mark.parametrize(("name", "hw_id"), [
    ("H200-SXM-141GB", "h200-sxm"), ("NVIDIA H200 141GB HBM3e", "h200-sxm"), ("H200 SXM 141GB", "h200-sxm"),
    ("NVIDIA B200 180GB HBM3e", "b200"), ("B200 192GB", "b200"), ("AMD Instinct MI300X 192GB", "mi300x"),
    ("AMD MI300X", "mi300x"), ("L40S 48GB", "l40s"), ("NVIDIA H100 NVL 94GB", "h100-nvl"), ("Tesla A100", "a100-sxm-80g"),
    ("A100 SXM4 40GB", "a100-sxm-40g"), ("H100 PCIe 80GB", "h100-pcie"),
])
def test_a_name_in_other_words_finds_its_part(name, hw_id):
    """Names no alias spells out find the one part whose names hold the same words once vendor, memory type and
    module words are set aside, or without the memory size where the size the name gives is the part's."""
    assert load_hardware(name).id == hw_id


@pytest.mark.parametrize("name", ["A100 40GB PCIe", "H200 80GB", "MI300X 128GB", "H20", "V100", "H100 500W",
                                  "A800 40GB", "DGX Station GB300", "MI350X"])
def test_another_part_is_not_taken_for_a_near_name(name):
    """A size the part of that name does not come in, or a part meshplan has no profile for, is an unknown name:
    a one-line error that lists the profiles, never the nearest part's memory."""
    with pytest.raises(MeshplanError, match="unknown hardware profile"):
        load_hardware(name)


def test_no_name_stands_for_two_parts():
    from meshplan.estimator.data_files import name_key

    seen: dict[str, str] = {}
    for hw_id in hardware_names():
        hw = load_hardware(hw_id)
        for name in {name_key(n) for n in (hw.id, hw.name, *hw.aliases)}:
            assert seen.setdefault(name, hw_id) == hw_id, f"{name!r}: {seen[name]} and {hw_id}"


def test_a_runs_hardware_column_and_the_cli_take_the_names_too(cli, tmp_path):
    from meshplan.estimator.validate import validate_rows

    row = dict(id="x", source="a log", framework="torchtitan", model="Llama 3 8B", layers="32", hidden="4096",
               heads="32", kv_heads="8", ffn_hidden="14336", vocab="128256", tied_embeddings="false", mlp="swiglu",
               seq_len="8192", gpus="8", gpus_per_node="8", dp_replicate="1", dp_shard="8", tp="1", pp="1",
               global_batch_size="8", micro_batch_size="1", precision="bf16", ac="selective", status="ok")
    named, by_id = validate_rows([dict(row, hardware="NVIDIA H100 80GB HBM3"), dict(row, hardware="h100-sxm")])
    assert named.error is None and named.predicted_tps_per_gpu == by_id.predicted_tps_per_gpu
    out = cli("estimate", "--hardware", "H100", "--gpus", "8", "--json")
    assert out.returncode == 0, out.stderr
    import json

    assert json.loads(out.stdout)["hardware"]["id"] == "h100-sxm"


def test_a_plan_on_a_switchless_board_keeps_its_pair_links(tmp_path):
    """The plan file embeds the hardware profile: a 4-GPU board's pair links travel with it; a switched node's plan
    reads as it did before the field existed (no `nvlink_pair_gbs: null`)."""
    from meshplan.estimator import TrainConfig, load_model
    from meshplan.planner.plan_file import load_plan, make_plan, plan_yaml, save_plan

    model = load_model("llama3-8b")
    board = make_plan(model, model.name, load_hardware("h200-sxm-4gpu"), TrainConfig(gpus=8, dp_shard=4, tp=2), steps=10)
    assert load_plan(save_plan(board, tmp_path / "board.yaml")).hardware.nvlink_pair_gbs == 150
    switched = make_plan(model, model.name, load_hardware("h200-sxm"), TrainConfig(gpus=8, dp_shard=4, tp=2), steps=10)
    assert "nvlink_pair_gbs" not in plan_yaml(switched)


def test_a_profile_extends_another_part_and_lists_only_what_differs(tmp_path, cli):
    """`extends:` fills in the other profile underneath (efficiencies and sources merged key by key); the other
    part's names stay its own; a cycle or a self-reference is a one-line error."""
    board = load_hardware("h200-sxm-4gpu")
    base = load_hardware("h200-sxm")
    assert (board.gpus_per_node, board.nvlink_pair_gbs, board.price) == (4, 150, None)
    assert board.efficiency == base.efficiency and board.hbm_total_gib == base.hbm_total_gib
    assert "H200" not in board.aliases and board.sources["hbm_total_gib"] == base.sources["hbm_total_gib"]
    mine = tmp_path / "my-h100.yaml"
    mine.write_text("extends: h100-sxm\nid: my-h100\nname: my H100\ninter_node_gbps: 200\n"
                    "efficiency:\n  clock: 0.9\nsources:\n  inter_node_gbps: our fabric\n")
    hw = load_hardware(str(mine))
    assert hw.inter_node_gbps == 200 and hw.efficiency.clock == 0.9 and hw.efficiency.gemm_bf16 == 0.80
    assert hw.sources["inter_node_gbps"] == "our fabric" and "intra_node_gbs" in hw.sources
    out = cli("estimate", "--model", "llama3-8b", "--hardware", str(mine), "--gpus", "8", "--json")
    assert out.returncode == 0, out.stderr
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"extends: {b}\nid: a\n")
    b.write_text(f"extends: {a}\nid: b\n")
    for path in (a, tmp_path / "self.yaml"):
        if path.name == "self.yaml":
            path.write_text(f"extends: {path}\nid: self\n")
        with pytest.raises(MeshplanError, match="'extends' must name another hardware profile"):
            load_hardware(str(path))
    out = cli("estimate", "--model", "llama3-8b", "--hardware", str(a), "--gpus", "8")
    assert out.returncode != 0 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1

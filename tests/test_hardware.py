import pytest

from meshplan.estimator import MeshplanError, load_hardware
from meshplan.estimator.hardware import hardware_names

REQUIRED = {"h100-sxm", "h100-pcie", "h100-nvl", "h100-96g-500w", "h200-sxm", "b200", "gb200", "a100-sxm-40g",
            "a100-sxm-80g", "a100-pcie-80g", "l40s", "mi300x", "mi325x"}
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

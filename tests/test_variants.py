"""Variant discovery and metadata checks: each error is one line naming kernels/<name>/variant.yaml and the field."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evo_sdpa import variants
from evo_sdpa.errors import StageError
from evo_sdpa.variants import Variant, discover, load_variant, select, variant_files


def good_meta(name: str, kind: str = "cuda") -> dict:
    entry = "kernel.cu" if kind == "cuda" else "kernel.py"
    return {
        "name": name,
        "kind": kind,
        "description": "a test variant",
        "sources": [entry],
        "support": {"dtypes": ["fp16", "bf16"], "head_dims": [64, 128], "causal": [True, False]},
    }


def make_variant(kernels: Path, folder: str, meta: dict | None = None, text: str | None = None,
                 files: tuple[str, ...] = ("kernel.cu", "kernel.py")) -> Path:
    path = kernels / folder
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("// source\n")
    if text is not None:
        (path / "variant.yaml").write_text(text)
    elif meta is not None:
        (path / "variant.yaml").write_text(yaml.safe_dump(meta))
    return path


@pytest.fixture
def kernels(tmp_path) -> Path:
    path = tmp_path / "kernels"
    path.mkdir()
    return path


def load_error(folder: Path) -> str:
    with pytest.raises(StageError) as info:
        load_variant(folder)
    message = str(info.value)
    assert "\n" not in message, f"not one line: {message!r}"
    assert message.startswith(f"kernels/{folder.name}/variant.yaml: "), message
    return message


# ---------------------------------------------------------------- the real kernels/


def test_discover_real_kernels():
    found = discover()
    assert {"v1_scalar", "triton_flash"} <= set(found)
    assert "common" not in found
    assert found["v1_scalar"].kind == "cuda"
    assert found["triton_flash"].kind == "triton"
    for name, variant in found.items():
        assert variant.name == name
        assert all(path.is_file() for path in variant.sources)
        assert variant_files(variant)[0] == variant.folder / "variant.yaml"
    assert found["v1_scalar"].sources[0].name == "kernel.cu"
    assert found["v1_scalar"].kernel_regex == "v1_scalar_attention_fwd"


# ---------------------------------------------------------------- temp kernels/


def test_discover_temp_folder_skips_common_and_hidden(kernels):
    make_variant(kernels, "alpha", good_meta("alpha"))
    make_variant(kernels, "beta", good_meta("beta", kind="triton"))
    (kernels / "common").mkdir()
    (kernels / "common" / "abi.h").write_text("")
    (kernels / ".cache").mkdir()
    (kernels / "_scratch").mkdir()
    (kernels / "README.md").write_text("not a folder")
    found = discover(kernels)
    assert sorted(found) == ["alpha", "beta"]
    assert found["beta"].kind == "triton"


def test_discover_missing_dir_is_empty(tmp_path):
    assert discover(tmp_path / "nowhere") == {}


def test_defaults_are_filled(kernels):
    variant = load_variant(make_variant(kernels, "alpha", good_meta("alpha")))
    assert variant.meta["build"]["allow_spills"] is False
    assert variant.meta["build"]["allow_warnings"] is False
    assert variant.meta["build"]["nvcc_flags"] == []
    assert variant.kernel_regex == ".*"
    assert variant.support["max_seq_len"] is None
    assert variant.support["min_compute_capability"] == "8.0"


def test_given_values_are_not_overwritten_by_defaults(kernels):
    meta = good_meta("alpha")
    meta["build"] = {"allow_spills": True}
    meta["kernel_regex"] = "alpha_fwd"
    variant = load_variant(make_variant(kernels, "alpha", meta))
    assert variant.meta["build"]["allow_spills"] is True
    assert variant.meta["build"]["allow_warnings"] is False
    assert variant.kernel_regex == "alpha_fwd"


def test_missing_variant_yaml(kernels):
    folder = make_variant(kernels, "alpha")
    message = load_error(folder)
    assert "missing" in message
    with pytest.raises(StageError, match="kernels/alpha/variant.yaml"):
        discover(kernels)


def test_invalid_yaml(kernels):
    folder = make_variant(kernels, "alpha", text="name: alpha\nsupport: [unclosed\n  kind: : :\n")
    message = load_error(folder)
    assert "not valid YAML" in message


def test_yaml_that_is_not_a_mapping(kernels):
    folder = make_variant(kernels, "alpha", text="- just\n- a list\n")
    assert "mapping" in load_error(folder)


def test_name_differs_from_folder(kernels):
    folder = make_variant(kernels, "alpha", good_meta("beta"))
    message = load_error(folder)
    assert "field 'name'" in message
    assert "'beta'" in message and "'alpha'" in message


def test_unknown_kind(kernels):
    meta = good_meta("alpha")
    meta["kind"] = "opencl"
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "'kind'" in message and "'opencl'" in message
    assert "cuda, triton" in message


def test_missing_support_dtypes(kernels):
    meta = good_meta("alpha")
    del meta["support"]["dtypes"]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "'support.dtypes'" in message and "missing" in message


def test_dtype_fp8(kernels):
    meta = good_meta("alpha")
    meta["support"]["dtypes"] = ["fp8"]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "support.dtypes[0]" in message and "'fp8'" in message
    assert "fp16, bf16" in message


def test_unknown_field(kernels):
    meta = good_meta("alpha")
    meta["sorces"] = ["kernel.cu"]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "'sorces'" in message and "sources" in message.split("allowed keys:")[1]


def test_source_that_does_not_exist(kernels):
    meta = good_meta("alpha")
    meta["sources"] = ["kernel.cu", "tiles.cuh"]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "field 'sources'" in message and "'tiles.cuh'" in message


def test_reserved_name_sdpa(kernels):
    message = load_error(make_variant(kernels, "sdpa", good_meta("sdpa")))
    assert "reserved" in message and "'sdpa'" in message


def test_cuda_entry_must_be_cu(kernels):
    meta = good_meta("alpha")
    meta["sources"] = ["helpers.cuh", "kernel.cu"]
    folder = make_variant(kernels, "alpha", meta, files=("kernel.cu", "helpers.cuh"))
    message = load_error(folder)
    assert "field 'sources'" in message and ".cu" in message and "'helpers.cuh'" in message


def test_triton_entry_must_be_py(kernels):
    meta = good_meta("alpha", kind="triton")
    meta["sources"] = ["kernel.cu"]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "field 'sources'" in message and ".py" in message


# ---------------------------------------------------------------- select


@pytest.fixture
def two(kernels) -> dict[str, Variant]:
    make_variant(kernels, "zeta", good_meta("zeta"))
    make_variant(kernels, "alpha", good_meta("alpha"))
    return discover(kernels)


def test_select_all_is_sorted(two):
    assert select(two, "all") == ["alpha", "zeta"]


def test_select_list_keeps_order(two):
    assert select(two, ["zeta", "alpha"]) == ["zeta", "alpha"]


def test_select_unknown_lists_known(two):
    with pytest.raises(StageError) as info:
        select(two, ["alpha", "gamma"])
    message = str(info.value)
    assert "\n" not in message
    assert "'variants'" in message and "'gamma'" in message
    assert "known: alpha, zeta" in message


def test_select_unknown_with_none_known():
    with pytest.raises(StageError, match="known: none"):
        select({}, ["alpha"])


# ---------------------------------------------------------------- support


def test_unsupported_reason(tmp_path):
    meta = good_meta("alpha")
    meta["support"] = {"dtypes": ["fp16"], "head_dims": [64], "causal": [False], "max_seq_len": 1024}
    variant = Variant("alpha", tmp_path, meta)
    assert variant.unsupported_reason("fp16", 64, False, 1024) is None
    assert variant.supports("fp16", 64, False)
    assert "dtype bf16" in variant.unsupported_reason("bf16", 64, False, 128)
    assert "head dim 128" in variant.unsupported_reason("fp16", 128, False, 128)
    assert "causal=True" in variant.unsupported_reason("fp16", 64, True, 128)
    assert "max_seq_len 1024" in variant.unsupported_reason("fp16", 64, False, 1025)
    assert not variant.supports("fp16", 64, True)


def test_unsupported_reason_without_max_seq_len(tmp_path):
    meta = good_meta("alpha")
    meta["support"]["max_seq_len"] = None
    variant = Variant("alpha", tmp_path, meta)
    assert variant.unsupported_reason("bf16", 128, True, 1_000_000) is None


def test_kernels_dir_points_at_the_repo():
    assert variants.KERNELS_DIR == Path(__file__).resolve().parents[1] / "kernels"


# ---------------------------------------------------------------- build.requires, build.sass_expect


def test_build_requires_and_sass_expect_default_to_empty(kernels):
    variant = load_variant(make_variant(kernels, "alpha", good_meta("alpha")))
    assert variant.meta["build"]["requires"] == []
    assert variant.meta["build"]["sass_expect"] == []


def test_build_requires_cutlass_and_sass_expect_pass(kernels):
    meta = good_meta("alpha")
    meta["build"] = {"requires": ["cutlass"], "sass_expect": ["HGMMA", "UTMALDG.2D", "SYNCS"]}
    variant = load_variant(make_variant(kernels, "alpha", meta))
    assert variant.meta["build"]["requires"] == ["cutlass"]
    assert variant.meta["build"]["sass_expect"] == ["HGMMA", "UTMALDG.2D", "SYNCS"]
    assert variant.meta["build"]["nvcc_flags"] == []


def test_build_requires_unknown_library(kernels):
    meta = good_meta("alpha")
    meta["build"] = {"requires": ["boost"]}
    assert load_error(make_variant(kernels, "alpha", meta)) == (
        "kernels/alpha/variant.yaml: key 'build.requires[0]': 'boost' is not valid (allowed: cutlass)")


@pytest.mark.parametrize("opcode", ["hgmma", "HGMMA ", ".2D", "HGMMA..F32", ""])
def test_build_sass_expect_rejects_what_is_not_an_opcode(kernels, opcode):
    meta = good_meta("alpha")
    meta["build"] = {"sass_expect": ["HGMMA", opcode]}
    message = load_error(make_variant(kernels, "alpha", meta))
    assert message.startswith("kernels/alpha/variant.yaml: key 'build.sass_expect[1]': ")
    assert "must match" in message


def test_build_sass_expect_must_be_a_list(kernels):
    meta = good_meta("alpha")
    meta["build"] = {"sass_expect": "HGMMA"}
    assert load_error(make_variant(kernels, "alpha", meta)) == (
        "kernels/alpha/variant.yaml: key 'build.sass_expect': 'HGMMA' is not valid (expected array)")


# ---------------------------------------------------------------- sources cover every include

def _local_includes(path: Path) -> set[str]:
    import re

    return set(re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M))


@pytest.mark.parametrize("variant", [v for v in discover().values() if v.kind == "cuda"], ids=lambda v: v.name)
def test_every_header_a_cuda_variant_includes_is_in_its_sources(variant):
    """The rules rerun a variant's chain when one of its sources changes, so a header it includes
    (its own, or a shared one in kernels/common) but does not list would be edited without effect.
    The ABI header is added for every CUDA variant by evo_sdpa.deps."""
    from evo_sdpa.deps import ABI_HEADER

    listed = set(variant.sources) | {ABI_HEADER}
    common = variants.KERNELS_DIR / variants.SHARED_DIR
    for source in variant.sources:
        for name in _local_includes(source):
            found = [d / name for d in (variant.folder, common) if (d / name).is_file()]
            if not found:
                continue  # a library header (cute/..., cutlass/...) found on another include path
            assert found[0] in listed, f"{variant.name}: {source.name} includes {name}, not in its sources"


def test_a_shared_header_is_a_source_of_exactly_the_variants_that_include_it():
    shared = variants.KERNELS_DIR / variants.SHARED_DIR / "sm80_online_softmax.cuh"
    users = sorted(v.name for v in discover().values() if shared in v.sources)
    assert users == ["v3_mma", "v4_pipelined"]
    v3 = load_variant(variants.KERNELS_DIR / "v3_mma")
    assert "common/sm80_online_softmax.cuh" in v3.meta["sources"]


def test_a_copy_of_a_variant_elsewhere_still_finds_its_shared_headers(tmp_path):
    """An evolution candidate is a copy of its parent's folder under results/evolve/: `common/`
    entries name kernels/common wherever the folder lives, and a proposer's request names them so."""
    import shutil

    from evo_sdpa.candidates import relative

    copy = tmp_path / "v4_pipelined"
    shutil.copytree(variants.KERNELS_DIR / "v4_pipelined", copy)
    child = load_variant(copy)
    shared = variants.KERNELS_DIR / variants.SHARED_DIR / "sm80_epilogue.cuh"
    assert shared in child.sources and (copy / "kernel.cu") in child.sources
    assert relative(child, shared) == "common/sm80_epilogue.cuh"
    assert relative(child, copy / "kernel.cu") == "kernel.cu"


def test_a_missing_shared_header_names_kernels_common(kernels):
    folder = kernels / "shared_user"
    folder.mkdir()
    (folder / "kernel.cu").write_text("// entry\n")
    meta = {"name": "shared_user", "kind": "cuda", "description": "d",
            "sources": ["kernel.cu", "common/no_such_header.cuh"],
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False], "layouts": ["bhsd"]}}
    (folder / "variant.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(StageError, match=r"'common/no_such_header.cuh', which does not exist in kernels/common/"):
        load_variant(folder)


def test_sanitizer_shapes_default_to_none_and_keep_only_the_shape(kernels):
    assert load_variant(make_variant(kernels, "alpha", good_meta("alpha"))).sanitizer_shapes == []
    meta = good_meta("beta")
    meta["sanitizer_shapes"] = [{"B": 1, "H": 2, "S": 520, "because": "a cluster split"}]
    assert load_variant(make_variant(kernels, "beta", meta)).sanitizer_shapes == [{"B": 1, "H": 2, "S": 520}]


def test_a_sanitizer_shape_without_its_length_is_refused_in_one_line(kernels):
    meta = good_meta("alpha")
    meta["sanitizer_shapes"] = [{"B": 1, "H": 2}]
    message = load_error(make_variant(kernels, "alpha", meta))
    assert "'sanitizer_shapes[0].S' is missing" in message

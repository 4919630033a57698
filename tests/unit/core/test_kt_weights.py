"""The converted-expert contract (core/kt_weights.py) against what kt-kernel 0.7.2 itself writes and validates.

The sizes and names were read off kt-kernel's own quantizer output (AMXInt8_MOE / AMXInt4_MOE save mode in
ktsft:amx: tests/integration/test_prepare_weights_image.py runs it); here the contract is held to kt-kernel's INT8
validator's own size table (kt_kernel/sft/weight_manifest.py, read from the locked wheel) and to the recipe keys.
"""

from __future__ import annotations

import pytest

from ktdeploy.core import kt_weights as kw

SHAPE = kw.Shape(hidden_size=512, intermediate_size=256, expert_num=16, pools=2)


def test_int8_sizes_are_the_validators_table():
    # validate_persistent_int8_weights: quant = hidden * intermediate/pools bytes; scales 4 bytes per output row
    s = kw.file_sizes("int8", SHAPE)
    assert s[("gate", "quant")] == s[("up", "quant")] == s[("down", "quant")] == 512 * 128
    assert s[("gate", "scale")] == s[("up", "scale")] == 128 * 4 and s[("down", "scale")] == 512 * 4


def test_amxint4_packs_two_weights_a_byte():
    s = kw.file_sizes("amxint4", SHAPE)
    assert s[("down", "quant")] == 512 * 128 // 2 and s[("down", "scale")] == 512 * 4


def test_layer_files_name_every_pool_projection_expert_and_kind_once():
    files = kw.layer_files("int8", SHAPE, 3)
    assert len(files) == 2 * 3 * 16 * 2
    assert "_layer_3/_numa_1/INT8_down_15_65536Byte_quant_.kt" in files
    for path, size in files.items():
        prefix, proj, expert, encoded, kind = kw.parse_file_name(path.rsplit("/", 1)[1])
        assert prefix == "INT8" and encoded == size and 0 <= expert < 16
    assert kw.layer_bytes("int8", SHAPE) == sum(files.values())
    assert kw.tree_bytes("amxint4", SHAPE, 4) == 4 * sum(kw.layer_files("amxint4", SHAPE, 0).values())


@pytest.mark.parametrize("shape, fmt, why", [
    (kw.Shape(512, 255, 16, 2), "int8", "not divisible by kt_threadpool_count"),
    (kw.Shape(512, 256, 16, 0), "int8", "must be positive"),
])
def test_shapes_kt_kernel_cannot_split(shape, fmt, why):
    assert why in (kw.shape_error(fmt, shape) or "")


# (hidden, intermediate, pools) -> did kt-kernel 0.7.2 (amx build) quantize, load and run it, per format: measured in
# ktsft:amx with AMXInt8_MOE/AMXInt4_MOE save mode + KTMoEWrapper(mode="sft") forward (docs/weight-formats.md).
MEASURED = {(512, 256, 1): (True, True), (512, 96, 1): (False, False), (512, 64, 1): (True, False),
            (512, 48, 1): (False, False), (512, 32, 1): (False, False), (320, 256, 1): (True, False),
            (352, 256, 1): (False, False), (384, 256, 1): (True, True), (448, 256, 1): (True, False),
            (512, 256, 4): (True, False), (512, 384, 2): (True, False), (256, 192, 1): (True, False),
            (1024, 160, 1): (False, False)}


@pytest.mark.parametrize("dims, ran", MEASURED.items(), ids=[f"{h}x{i}/{p}" for h, i, p in MEASURED])
def test_shape_rule_matches_what_kt_kernel_ran(dims, ran):
    h, i, p = dims
    for fmt, ok in zip(("int8", "amxint4"), ran, strict=True):
        assert (kw.shape_error(fmt, kw.Shape(h, i, 8, p)) is None) is ok, (fmt, dims)


def test_int8_manifest_has_the_keys_the_validator_demands():
    layer = kw.layer_entry(0, 2, {"_layer_0/_numa_0/x": (10, "a" * 64)})
    m = kw.manifest("int8", SHAPE, [layer], {"plan": "p"})
    assert m["schema_version"] == 2 and m["layout"] == "kt-int8-n32-k64-vnni-v1" and m["backend"] == "INT8"
    assert (m["state"], m["expert_weight_format"], m["threadpool_count"], m["expert_num"], m["hidden_size"],
            m["intermediate_size"]) == ("ready", "int8", 2, 16, 512, 256)
    assert m["bytes"] == 10 and m["layers"][0]["files"][0] == {"path": "_layer_0/_numa_0/x", "size_bytes": 10,
                                                               "sha256": "a" * 64}
    assert kw.manifest_name("int8") == "kt-weight-manifest.json"
    assert kw.manifest_name("amxint4") == "ktdeploy-weights.json"


@pytest.mark.parametrize("setup, kt, wp, want", [
    ("int8", {}, "/m/X-INT8", ("int8", 1, "/m/X-INT8", None)),
    ("int8", {"kt_tp_enabled": True, "kt_threadpool_count": 2}, "/m/X-INT8", ("int8", 2, "/m/X-INT8", None)),
    ("int8", {"kt_tp_enabled": False, "kt_threadpool_count": 2}, "/m/X-INT8", ("int8", 1, "/m/X-INT8", None)),
    ("int4", {"kt_tp_enabled": True, "kt_threadpool_count": 2}, "/m/X-I4", ("amxint4", 2, "/m/X-I4", None)),
    ("int8", {"kt_weight_lifecycle": "ephemeral"}, "/dev/shm/kt-int8-run-01", ("int8", 1, None, "run-01")),
    # an ephemeral lifecycle whose path is not kt-kernel's root: check refuses it; the persistent reading stays
    ("int8", {"kt_weight_lifecycle": "ephemeral"}, "/m/X-INT8", ("int8", 1, "/m/X-INT8", None)),
])
def test_what_a_recipe_needs_converted(setup, kt, wp, want):
    n = kw.needed_by(setup, kt, "/m/X", wp)
    assert n is not None and (n.format, n.pools, n.output, n.ephemeral_run_id) == want and n.model == "/m/X"


@pytest.mark.parametrize("setup, wp", [("bf16", "/m/X-INT8"), ("fp8", None), ("int8", None), ("int8", 3)])
def test_native_setups_need_no_conversion(setup, wp):
    assert kw.needed_by(setup, {}, "/m/X", wp) is None


@pytest.mark.parametrize("path, ok", [("/dev/shm/kt-int8-run-01", True), ("/dev/shm/kt-int8-abc", False),
                                      ("/dev/shm/kt-int8-run/01", False), ("/tmp/kt-int8-run-01", False),
                                      ("/dev/shm/kt-int8-.hidden1", False)])
def test_ephemeral_root_is_kt_kernels_rule(path, ok):
    assert bool(kw.EPHEMERAL_ROOT.fullmatch(path)) is ok

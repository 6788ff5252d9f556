"""common.atlas: the op atlas's models and readings, and CoursePartitioner on every atlas model.

What each backend ran is tested beside the backend (tests/backends/test_*_runs.py).

``CoursePartitioner`` (common.edge) must tag exactly what ``XnnpackPartitioner`` tags on each
atlas model quantized with ``XNNPACKQuantizer``: the same ops kept whole, the same partitions,
the same quantize/dequantize nodes folded. Its table knows every op the atlas holds; an atlas
model that meets a new op makes it refuse, naming the op (its contract: a partition never
differs silently), and fails here.
"""

import ast
from pathlib import Path

import pytest
import torch

from common import atlas
from common.pt2e import quiet

quiet()

from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from graphs import BothPartitioners, Partitioned  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.filterwarnings(r"ignore:The tensor attributes self\.rnn\._flat_weights"),
    # XNNPACKQuantizer exports its conv-bn patterns at every prepare (~2 s): once per worker
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
]

NAMES = [item.name for item in atlas.ENTRIES]


def both(name: str | atlas.Entry) -> BothPartitioners:
    item = atlas.entry(name) if isinstance(name, str) else name
    program = torch.export.export(atlas.quantize(item, "xnnpack"), atlas.example_args(item))
    partitioners = BothPartitioners()
    try:
        to_edge_transform_and_lower(program, partitioner=[partitioners])
    except Partitioned:  # both partitioned: compare
        pass
    except NotImplementedError as error:  # raised by CoursePartitioner's filter, mid-lowering
        partitioners.refused = partitioners.refused or str(error)
    else:
        pytest.fail("to_edge_transform_and_lower returned before partitioning")
    return partitioners


@pytest.mark.parametrize("name", NAMES)
def test_course_partitioner_agrees_with_xnnpack_on_every_atlas_model(name):
    partitioners = both(name)
    assert partitioners.refused is None, f"CoursePartitioner refused it: {partitioners.refused}"
    assert partitioners.kept_whole["course"] == partitioners.kept_whole["xnnpack"]
    assert partitioners.tagged["course"] == partitioners.tagged["xnnpack"], "the partitions differ"


def _power(exponent: int) -> atlas.Entry:
    """x ** exponent between linears (an RMSNorm's square, or a cube)."""
    from torch import nn

    class Power(nn.Module):
        def forward(self, x):
            return x.pow(exponent)

    def build():
        torch.manual_seed(0)
        return atlas.BetweenLinears(Power()).eval()

    return atlas.Entry(f"pow · {exponent}", ("pow",), "between linears", build, atlas.TOKENS)


@pytest.mark.parametrize("exponent", [2, 3])
def test_xnnpack_takes_a_square_and_not_a_cube_and_the_table_says_so(exponent):
    """PowConfig: "Only support powers of two" (power == 2): the table's constraint, checked
    against XNNPACK's own partitioner on both sides of it."""
    from common.edge import SUPPORTED

    partitioners = both(_power(exponent))
    assert partitioners.refused is None, partitioners.refused
    assert partitioners.tagged["course"] == partitioners.tagged["xnnpack"], "the partitions differ"
    partitions, _ = partitioners.tagged["xnnpack"]
    tagged = {node for partition in partitions for node in partition}
    assert any("pow" in node for node in tagged) is (exponent == 2), tagged
    assert SUPPORTED["pow.Tensor_Scalar"].int8 is False, "a float kernel only"


def test_a_rotary_mul_broadcasts_so_x86_leaves_it_float_and_xnnpack_makes_it_int8():
    """x86 annotates a mul only for two tensors of one shape (torchao's ``_same_shape``); the
    rotary's ``cos`` and ``sin`` are (positions, features / 2), broadcast over the batch."""
    item = atlas.entry("mul · rotary")
    x86 = atlas.reported(item, "x86")
    assert x86["status"] == "float"
    assert "mul of shapes [2, 6, 8] and [6, 8]" in x86["reason"]["en"], x86
    assert atlas.reported(item, "xnnpack")["status"] == "int8 static"


def test_a_kv_cache_write_stays_float_for_every_quantizer():
    item = atlas.entry("index_copy_ · KV cache")
    for quantizer in ("x86", "xnnpack"):
        fate = atlas.reported(item, quantizer)
        assert fate["status"] == "float", quantizer
        assert "the cache it writes keeps float values" in fate["reason"]["en"], fate
    assert atlas.annotation(item, atlas.quantize(item, "x86")) == "float"


def test_the_atlas_has_at_least_40_ops_each_with_one_model():
    ops = {item.op for item in atlas.ENTRIES}
    assert len(ops) >= 40
    assert len(NAMES) == len(set(NAMES)), "one row per name"


@pytest.mark.parametrize("name", NAMES)
def test_each_model_exports_with_its_op_in_the_graph(name):
    item = atlas.entry(name)
    graph = torch.export.export(item.build(), atlas.example_args(item)).graph
    assert atlas.nodes_of(item, graph), f"{name}: no node of {item.ops} in the exported graph"


def test_an_unknown_entry_names_the_ones_there_are():
    with pytest.raises(KeyError, match="one of: conv1d, conv2d"):
        atlas.entry("conv4d")


def test_an_unknown_quantizer_names_the_columns():
    with pytest.raises(ValueError, match="one of: x86, xnnpack, openvino, arm"):
        atlas.make_quantizer("tosa")


def test_the_fused_add_after_a_linear_reads_as_fused_and_runs_as_a_post_op():
    item = atlas.entry("add · after linear")
    assert atlas.reported(item, "x86")["status"] == "int8 fused"
    ran = atlas.x86_runs(item, atlas.quantize(item, "x86"))
    assert ran["op"].startswith("fused: qlinear_pointwise"), ran
    assert "add" in ran["op"]


@pytest.mark.parametrize(
    "name", ["relu", "hardswish", "gelu", "tanh", "leaky_relu · after linear", "add · after linear"]
)
def test_x86s_fused_ops_read_as_fused_in_the_converted_graph(name):
    """x86 marks a fused activation with neither an input nor an output spec (the op after it
    quantizes its output; the add of linear + add + ReLU has no spec at all): still fused."""
    item = atlas.entry(name)
    assert atlas.annotation(item, atlas.quantize(item, "x86")) == "int8 fused"
    assert atlas.reported(item, "x86")["status"] == "int8 fused"


def test_sdpa_between_int8_linears_reads_as_float():
    """XNNPACKQuantizer quantizes q, k, v and the output (the linears' tensors) and annotates
    nothing on SDPA itself."""
    item = atlas.entry("scaled_dot_product_attention")
    for quantizer in ("xnnpack", "openvino"):
        converted = atlas.quantize(item, quantizer, fold_quantize=quantizer != "openvino")
        assert atlas.annotation(item, converted) == "float", quantizer
        assert atlas.reported(item, quantizer)["status"] == "float", quantizer


def test_a_layer_norm_between_int8_linears_reads_as_float():
    item = atlas.entry("layer_norm")
    for quantizer in ("x86", "xnnpack"):
        assert atlas.reported(item, quantizer)["status"] == "float", quantizer
        assert atlas.annotation(item, atlas.quantize(item, quantizer)) == "float", quantizer


def test_a_swiglus_mul_is_int8_where_a_broadcast_scale_is_not():
    """x86 annotates a mul of two tensors of one shape (a language model's SwiGLU,
    ``silu(w1 x) * w3 x``), not a mul whose operand broadcasts (ConvNeXt's layer scale)."""
    swiglu, scale = atlas.entry("mul · SwiGLU"), atlas.entry("mul · layer scale")
    assert atlas.reported(swiglu, "x86")["status"] == "int8 static"
    assert atlas.reported(scale, "x86")["status"] == "float"
    assert atlas.reported(swiglu, "xnnpack")["status"] == "int8 static"
    assert atlas.annotation(swiglu, atlas.quantize(swiglu, "x86")) == "int8"


def test_the_public_names_are_documented_as_common_atlas():
    """The API page (autodoc of ``common.atlas``) and sphinx-gallery's backreferences name
    them where the lessons import them, whichever file of the package or backend holds them."""
    for name in atlas.__all__:
        public = getattr(atlas, name)
        if callable(public):
            assert public.__module__ == "common.atlas", name


def test_run_cached_keys_on_whole_files_not_on_the_rows():
    """No comment is a cut: the key holds files whole; not entries.py, so a new row computes
    only itself."""
    from common.atlas import run

    root = Path(run.__file__).resolve().parents[2]
    files = {p.resolve().relative_to(root).as_posix() for p in run._key_files()}
    assert {
        "common/atlas/run.py",
        "common/atlas/recipe.py",
        "common/backends/x86/runs.py",
        "common/backends/xnnpack/runs.py",
        "common/backends/openvino.py",
        "common/backends/arm.py",
        "common/graph.py",
        "common/coverage/__init__.py",  # the status and reason each row shows
    } <= files, sorted(files)
    assert "common/atlas/entries.py" not in files, "a new row computes only itself"


def test_the_backends_run_readers_import_nothing_of_the_atlas():
    """``common.atlas`` asks the backends; the reverse would be an import circle."""
    from common.atlas import run

    backends = Path(run.__file__).resolve().parents[1] / "backends"
    for path in ("x86/runs.py", "xnnpack/runs.py", "openvino.py", "arm.py"):
        for node in ast.walk(ast.parse((backends / path).read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not [n for n in names if n.startswith("common.atlas")], path


#: The rows whose op coverage does not report (not in ``common.coverage.OPS``): the page shows
#: their status read from the converted graph instead. A new row lands here only on purpose.
NOT_REPORTED_BY_COVERAGE = {"dropout": "an eval-mode dropout computes nothing: not an op of OPS"}


def test_an_op_coverage_does_not_report_is_a_row_chosen_on_purpose():
    from common.coverage import OPS

    reported = {str(op).split(".")[1] for op in OPS}
    silent = {item.name for item in atlas.ENTRIES if not set(item.ops) & reported}
    assert silent == set(NOT_REPORTED_BY_COVERAGE), (
        f"coverage reports no op of {sorted(silent - set(NOT_REPORTED_BY_COVERAGE))}: add the op "
        "to common/coverage/ops.py (OPS), or to NOT_REPORTED_BY_COVERAGE with the reason"
    )


def test_a_row_being_made_elsewhere_is_read_after_making_a_later_one_meanwhile(
    tmp_path, monkeypatch
):
    """Two builds split the atlas: a row another process is making is not waited for idly."""
    import threading
    import time

    from filelock import FileLock

    from common.atlas import run

    monkeypatch.setattr("common.cache.cache_folder", lambda: tmp_path)
    made = []
    monkeypatch.setattr(run, "run_entry", lambda item: made.append(item.name) or item.name)
    first, second = atlas.ENTRIES[:2]
    rows = tmp_path / "op_atlas"
    rows.mkdir()
    first_row, second_row = (rows / f"{run._row_key(item)}.json" for item in (first, second))
    holding = threading.Event()

    def the_other_build_makes_the_first_row_until_the_second_is_kept():
        with FileLock(f"{first_row}.lock"):  # a thread of its own: filelock refuses one thread
            holding.set()
            deadline = time.monotonic() + 60  # without the split, run_cached waits: it fails
            while not second_row.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            first_row.write_text('"made by the other build"')

    other = threading.Thread(target=the_other_build_makes_the_first_row_until_the_second_is_kept)
    other.start()
    holding.wait()
    assert run.run_cached(first) == "made by the other build"
    other.join()
    assert made[:1] == [second.name] and first.name not in made, made

"""common.lowering against torchao's lower_pt2e_quantized_to_x86: same ops, constants, outputs.

The matrix is every zoo model and every M02 test model, quantized with X86InductorQuantizer
(the quantizer the x86 lowering is written for; the course quantizer's int8 activations are
lowered too, but oneDNN's int8 conv on this kind of CPU takes uint8 only, so they cannot run).
A second matrix holds transformer graphs written here and not used anywhere else (an
``nn.TransformerEncoderLayer``, q/k/v linears + SDPA, a tiny ViT, a 3-D MLP, a linear over a
transposed input), each with the static and the dynamic x86 config. torchvision's
MobileNetV3-small at full size joins the first (the other architectures of M07-1 lower alike,
static and dynamic, checked once by hand: a lowering of each costs 40-80 s).
"""

import collections

import pytest
import torch
import torch.nn.functional as F
from graphs import TEST_MODELS, TwoConvs, build, call_function_targets
from marks import ON_THE_PATTERN_WORKER
from torch import nn

from common.models import (
    LARGE_MODEL_NAMES,
    MODEL_NAMES,
    TRANSFORMER_NAMES,
    VISION_NAMES,
    example_inputs,
    get_model,
    input_shape,
)
from common.pt2e import calibrate, export_module, quiet, x86_quantizer

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from common import handmade, lowering  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`:FutureWarning"),
    pytest.mark.usefixtures("torchao_patterns_exported_once"),  # tests/conftest.py
    ON_THE_PATTERN_WORKER,  # one worker lowers the matrix once (tests/marks.py)
]


# --- Models that reach the int8-output residual add, which the zoo and M02's models do not ----


class ResidualThenConv(nn.Module):
    """A basic block whose output is quantized for the next conv: the int8-output sum."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.head(torch.relu(self.conv2(torch.relu(self.conv1(x))) + x))


class ResidualNoRelu(nn.Module):
    """conv + skip with nothing after the add: the float-output sum without relu."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.body(x) + x


EXTRA_MODELS = {"residual_then_conv": ResidualThenConv, "residual_no_relu": ResidualNoRelu}


# --- Transformer graphs, held out: written for these tests only --------------------------------

DIM, TOKENS = 16, 8


class EncoderLayer(nn.Module):
    """PyTorch's own encoder layer: nn.MultiheadAttention, whose float in_proj is a bmm over
    the transposed tokens and whose float out_proj is packed for MKL."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class QKVAttention(nn.Module):
    """q/k/v/out nn.Linear + SDPA: three int8 projections read one input."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        n = x.shape[0]

        def heads(t):
            return t.view(n, TOKENS, 2, DIM // 2).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        )
        return self.out(attended.transpose(1, 2).reshape(n, TOKENS, DIM))


class TinyViT(nn.Module):
    """Patch conv, class token, position embedding, one pre-norm encoder layer, a 2-D head."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, 4, stride=4)  # 16x16 images: 16 patches
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.02)
        self.block = nn.TransformerEncoderLayer(
            DIM, 2, 2 * DIM, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.block(x))[:, 0])


class TinyViTFloatHead(TinyViT):
    """The same ViT with its classifier head left in float: a 2-D float linear, packed for MKL."""

    FLOAT_LAYERS = ("head",)  # quantized() gives these set_module_name_qconfig(name, None)


class MLPFloatMiddle(nn.Module):
    """A 2-D MLP whose middle linear is left in float, between two int8 ones."""

    FLOAT_LAYERS = ("fc2",)

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(DIM, 32), nn.Linear(32, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class MLP3D(nn.Module):
    """A transformer's MLP on (batch, tokens, dim): both linears 3-D."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TransposedInput(nn.Module):
    """int8 linears over a transposed (non-contiguous) 3-D input: the re-export writes bmm."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x.transpose(0, 1)).transpose(0, 1))


TOKEN_SHAPE, IMAGE_SHAPE = (TOKENS, DIM), (3, 16, 16)
HELD_OUT = {  # name: (model class, the shape of one sample)
    "encoder_layer": (EncoderLayer, TOKEN_SHAPE),
    "qkv_sdpa": (QKVAttention, TOKEN_SHAPE),
    "tiny_vit": (TinyViT, IMAGE_SHAPE),
    "tiny_vit_float_head": (TinyViTFloatHead, IMAGE_SHAPE),
    "mlp_float_middle": (MLPFloatMiddle, (DIM,)),
    "mlp_3d": (MLP3D, TOKEN_SHAPE),
    "transposed_input": (TransposedInput, TOKEN_SHAPE),
}
# (model, dynamic): every held-out graph twice; the 2-D linears of M02's MLPs dynamic too
# (qlinear_pointwise.tensor, relu fused)
TRANSFORMER_CASES = [
    *((name, dynamic) for name in HELD_OUT for dynamic in (False, True)),
    ("linear_relu", True),
    ("mlp", True),
]
# The M02 test models that do not reach a lowering (the x86 quantizer refuses them) or hold a
# pattern common.lowering refuses by name (test_unlowered_test_models_are_refused_by_name).
X86_REFUSES = {"same_padding_transpose_bn", "reused_relu"}
LOWERING_REFUSES = {
    "transpose_bn": "float 2-D/3-D convolution",  # a conv-transpose, packed for mkldnn
    "buffer_mutation": "an op on constants only",  # the buffer's update
}
MATRIX = [
    *MODEL_NAMES,
    *LARGE_MODEL_NAMES,
    *(name for name in TEST_MODELS if name not in X86_REFUSES | LOWERING_REFUSES.keys()),
    *EXTRA_MODELS,
    # M05: a class token (an op on constants only), position embeddings, 3-D linears, SDPA;
    # nn.MultiheadAttention's float projections (a bmm, an MKL linear). The encoder adds
    # nothing new and costs a lowering of 24 linears.
    "vit_sdpa",
    "vit_mha",
    # torchvision's MobileNetV3-small at full size (M07-1): hardswish, hardsigmoid, in-place
    # adds and the nine squeeze-excitation muls x86 leaves float between int8 convs.
    "mobilenet_v3_small",
]


def dynamic_x86():
    config = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return X86InductorQuantizer().set_global(config)


def inputs(name: str, seed: int = 0) -> tuple:
    """The batch a matrix model is exported, calibrated and compared with (the large one: 2)."""
    if name in HELD_OUT:
        return example_inputs(2, seed=seed, shape=HELD_OUT[name][1])
    if name in LARGE_MODEL_NAMES or name in TRANSFORMER_NAMES or name in VISION_NAMES:
        return example_inputs(2, seed=seed, shape=input_shape(name))
    return example_inputs(8, seed=seed)


def make_model(name: str) -> nn.Module:
    if name in HELD_OUT:
        torch.manual_seed(0)  # nn layers draw their init from the global RNG
        return HELD_OUT[name][0]().eval()
    if name in EXTRA_MODELS:
        return EXTRA_MODELS[name]().eval()
    large = name in (*LARGE_MODEL_NAMES, *TRANSFORMER_NAMES, *VISION_NAMES)
    return get_model(name) if large else build(name)


def quantized(name: str, dynamic: bool = False) -> torch.fx.GraphModule:
    model = make_model(name)
    quantizer = dynamic_x86() if dynamic else x86_quantizer()
    for layer in getattr(model, "FLOAT_LAYERS", ()):
        quantizer.set_module_name_qconfig(layer, None)
    prepared = prepare_pt2e(export_module(model, inputs(name)), quantizer)
    with torch.no_grad():
        for seed in range(4):  # as common.pt2e.calibrate, in the model's own image shape
            prepared(*inputs(name, seed))
    return convert_pt2e(prepared)


def dense(t: torch.Tensor) -> torch.Tensor:
    """A prepacked weight is an opaque mkldnn tensor; to_dense reads its values back."""
    return t.to_dense() if t.layout == torch._mkldnn else t


@pytest.fixture(scope="module")
def both_lowered():
    cache = {}

    def get(name, dynamic=False):
        if (name, dynamic) not in cache:
            model, x = quantized(name, dynamic), inputs(name)
            lowered = (lower_pt2e_quantized_to_x86(model, x), lowering.lower(model, x))
            cache[name, dynamic] = lowered
        return cache[name, dynamic]

    return get


def mkl_packed(gm) -> set:
    """The constants MKL's float linears read as packed weights."""
    return {n.args[1].target for n in gm.graph.nodes if n.target == lowering.MKL_LINEAR}


def assert_same_lowering(theirs, mine, name):
    """The same ops, the same constants, bit-equal outputs on two batches."""
    mine.graph.lint()
    assert call_function_targets(mine) == call_function_targets(theirs), "the ops differ"
    ours, expected = mine.state_dict(), theirs.state_dict()
    assert ours.keys() == expected.keys(), "the constants differ"
    assert mkl_packed(mine) == mkl_packed(theirs)
    for key, value in expected.items():
        assert ours[key].layout == value.layout and ours[key].dtype == value.dtype, key
        if key in mkl_packed(theirs):  # bytes differ from packing to packing: the outputs tell
            assert ours[key].shape == value.shape, f"{key} differs"
            continue
        assert torch.equal(dense(ours[key]), dense(value)), f"{key} differs"
    # small_cnn's lowered graph fails to run as torchao returns it (M03-1): fix both alike.
    lowering.reshape_views(theirs)
    lowering.reshape_views(mine)
    for seed in (0, 100):
        x = inputs(name, seed)
        assert torch.equal(mine(*x), theirs(*x)), "outputs differ"


@pytest.mark.parametrize("name", MATRIX)
def test_lower_matches_torchao_bit_for_bit(both_lowered, name):
    assert_same_lowering(*both_lowered(name), name)


@pytest.mark.parametrize(
    ("name", "dynamic"),
    TRANSFORMER_CASES,
    ids=[f"{name}-{'dynamic' if dynamic else 'static'}" for name, dynamic in TRANSFORMER_CASES],
)
def test_transformer_graphs_match_torchao(both_lowered, name, dynamic):
    assert_same_lowering(*both_lowered(name, dynamic), name)


def test_transformer_cases_reach_the_new_rewrites(both_lowered):
    """Dynamic int8 linears, MKL's float linears, shared dequantize copies, bmm left as is."""
    ops = collections.Counter()
    for name, dynamic in TRANSFORMER_CASES:
        ops.update(call_function_targets(both_lowered(name, dynamic)[1]))
    assert ops["onednn.qlinear_pointwise.tensor"] >= 3, "2-D dynamic linears: the .tensor op"
    assert ops["mkl._mkl_linear"] >= 8, "out_proj of every encoder layer, the float head, fc2"
    assert ops["aten.bmm.default"] >= 4, "in_proj and the transposed-input linears stay bmm"
    start = lowering.reexport(quantized("qkv_sdpa", True), inputs("qkv_sdpa"))
    assert lowering.promote_dequantize(start), "q, k and v share one dynamic dequantize"
    fused = [n for n in both_lowered("mlp", True)[1].graph.nodes if n.args[10:11] == ("relu",)]
    assert [n.target for n in fused] == [lowering.QLINEAR_TENSOR] * 2, "both relus fused"


@pytest.mark.parametrize(("name", "words"), LOWERING_REFUSES.items())
def test_unlowered_test_models_are_refused_by_name(name, words):
    model = quantized(name)
    with pytest.raises(NotImplementedError, match=words) as refused:
        lowering.lower(model, inputs(name))
    assert "(node '" in str(refused.value), "the error names the node"


def test_matrix_reaches_every_rewrite(both_lowered):
    """Every op the lowering can write appears somewhere in the matrix."""
    seen = collections.Counter()
    for name in MATRIX:
        for node in both_lowered(name)[1].graph.nodes:
            if node.op == "call_function" and "onednn" in str(node.target):
                out_dtype = node.args[14] if node.target == lowering.QCONV_ADD else node.args[-4]
                unary = node.args[-3]
                seen[(str(node.target).split(".")[1], str(out_dtype), unary)] += 1
    dtypes = {(op, dtype) for op, dtype, _ in seen}
    assert {
        ("qconv_pointwise", "torch.uint8"),
        ("qconv_pointwise", "torch.float32"),
        ("qconv2d_pointwise", "torch.uint8"),
        ("qconv2d_pointwise", "torch.float32"),
        ("qlinear_pointwise", "torch.uint8"),
        ("qlinear_pointwise", "torch.float32"),
    } <= dtypes, seen
    assert {unary for *_, unary in seen} == {"none", "relu"}


def test_weights_quantized_in_the_graph_fold_as_inductor_folds_them():
    """convert_pt2e(fold_quantize=False) leaves quantize(w) on the float weight: both fold it."""
    x = inputs("small_cnn")
    prepared = prepare_pt2e(export_module(build("small_cnn"), x), x86_quantizer())
    calibrate(prepared)
    model = convert_pt2e(prepared, fold_quantize=False)
    theirs, mine = lower_pt2e_quantized_to_x86(model, x), lowering.lower(model, x)
    assert_same_lowering(theirs, mine, "small_cnn")


def test_mkl_packs_one_weight_into_different_bytes_that_compute_alike():
    """Why assert_same_lowering compares MKL's packed weights by shape and by the outputs only."""
    weight, x = torch.randn(DIM, 2 * DIM), torch.randn(4, 2 * DIM)  # an (out, in) weight
    first, second = (lowering.MKL_PACK(weight, 4) for _ in range(2))
    assert not torch.equal(first.to_dense(), second.to_dense()), "MKL's own bytes differ"
    out = [lowering.MKL_LINEAR(x, packed, weight, None, 4) for packed in (first, second)]
    assert torch.equal(*out), "the same numbers"
    torch.testing.assert_close(out[0], x @ weight.t())


def test_small_cnn_lowered_fails_until_views_become_reshapes():
    model, x = quantized("small_cnn"), example_inputs(8)
    lowered = lower_pt2e_quantized_to_x86(model, x)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        lowered(*x)
    assert lowering.reshape_views(lowered) == ["view"]
    assert torch.equal(lowered(*x), lowered(*x))


def test_lower_accepts_handmade_convert():
    x = example_inputs(8)
    ours = handmade.prepare(export_module(build("small_cnn"), x), x86_quantizer())
    calibrate(ours)
    theirs = quantized("small_cnn")
    a, b = lowering.lower(handmade.convert(ours), x), lowering.lower(theirs, x)
    lowering.reshape_views(a)
    lowering.reshape_views(b)
    assert torch.equal(a(*x), b(*x))


def test_lower_has_one_name():
    assert not hasattr(handmade, "lower"), "lower lives in common.lowering only"


# --- What common.lowering refuses, loudly -----------------------------------------------------


class LinearAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        rows = x.flatten(0, 2)
        return self.fc(rows) + rows


def first_conv_left_float():
    config = get_default_x86_inductor_quantization_config()
    return X86InductorQuantizer().set_global(config).set_module_name_qconfig("a", None)


UNSUPPORTED = [
    # (model, quantizer, the node the message must name, words the message must contain)
    (LinearAdd, x86_quantizer, "add", "qlinear binary"),
    (TwoConvs, first_conv_left_float, "convolution", "float 2-D/3-D convolution"),
]


@pytest.mark.parametrize(("make_model", "make_quantizer", "node", "words"), UNSUPPORTED)
def test_unsupported_patterns_raise_naming_the_node(make_model, make_quantizer, node, words):
    x = example_inputs(8)
    prepared = prepare_pt2e(export_module(make_model().eval(), x), make_quantizer())
    calibrate(prepared)
    model = convert_pt2e(prepared)
    lower_pt2e_quantized_to_x86(model, x)  # torchao lowers it: the refusal is ours alone
    with pytest.raises(NotImplementedError, match=words) as error:
        lowering.lower(model, x)
    assert f"node '{node}" in str(error.value)
    assert "lower_pt2e_quantized_to_x86" in str(error.value), "the message says what to use"

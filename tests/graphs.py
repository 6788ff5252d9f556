"""Test-only models and graph helpers shared by test_handmade.py, test_lowering.py and
test_edge.py, and ``BothPartitioners`` (test_edge.py, test_atlas.py)."""

import collections
import functools

import torch
from torch import nn

from common.models import MODEL_NAMES, TRANSFORMER_NAMES, get_model

C, H, W = 3, 16, 16  # the zoo's image shape: every test model takes example_inputs(...)


# --- Test-only models: layer kinds common in real CNNs and MLPs that the zoo does not have ------


class ConvNoBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.relu(self.conv(x))


class StridedDepthwise(nn.Module):
    """Stride 2, then a depthwise conv (groups == channels), then a 1x1 pointwise conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1)

    def forward(self, x):
        return self.pointwise(torch.relu(self.depthwise(torch.relu(self.stem(x)))))


class ConvBN(nn.Module):
    """conv -> bn with no relu, and a bias-free conv -> bn (folding must create the bias)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.bn1(self.conv1(x)))))


class MLP(nn.Module):
    """flatten -> (linear -> relu) x 2 -> linear."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(C * H * W, 64),
            nn.ReLU(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.layers(x)


class LinearBN(nn.Module):
    """2-D linear -> BatchNorm1d, folded like conv -> bn."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(C * H * W, 32)
        self.bn = nn.BatchNorm1d(32)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(torch.flatten(x, 1)))))


class Residual(nn.Module):
    """A ResNet basic block: conv-bn-relu, conv-bn, + skip, relu."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(x + y)


class Pools(nn.Module):
    """avg pool and adaptive avg pool between convs, then a classifier head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.gap(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class ReLU6Hardtanh(nn.Module):
    """MobileNet's relu6 (a hardtanh in the graph) after a conv, and a max pool with 2 users."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.act = nn.ReLU6()
        self.pool = nn.MaxPool2d(2)
        self.left = nn.Conv2d(8, 8, 1)
        self.right = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = self.pool(self.act(self.conv(x)))
        return self.left(x) * self.right(x)


class CatBranches(nn.Module):
    """Inception-style: the input feeds two convs, their outputs are concatenated."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(C, 4, 1)
        self.b = nn.Conv2d(C, 4, 3, padding=1)
        self.mix = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.mix(torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1))


class BatchedLinear(nn.Module):
    """Linear on a 3-D input (batch, tokens, features), as in transformers' MLP blocks."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(C * W, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        tokens = x.permute(0, 2, 1, 3).reshape(x.shape[0], H, C * W)
        return self.fc2(torch.relu(self.fc1(tokens)))


class Conv1d(nn.Module):
    """conv1d over the flattened image rows, and a conv whose output has two users."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(C, 8, 5, padding=2)
        self.proj = nn.Conv1d(8, 8, 1)

    def forward(self, x):
        y = self.conv(x.flatten(2))
        return self.proj(y) + torch.relu(y)


class ResidualInPlace(nn.Module):
    """ResNet code as people write it: ``out += identity`` (aten.add_), and an in-place mul_."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(C, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        identity = torch.relu(self.stem(x))
        out = self.conv(identity)
        out += identity
        out *= identity
        return torch.relu(out)


class ConvSigmoid(nn.Module):
    """conv -> sigmoid: a bias to quantize in int32, an output with fixed qparams."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))


class SamePaddingTransposeBN(nn.Module):
    """BatchNorm after a padding="same" conv (aten.conv2d.padding) and after a transposed conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding="same")
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn_up = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn_up(self.up(torch.relu(self.bn(self.conv(x)))))


class TransposeBN(nn.Module):
    """conv-transpose -> BatchNorm alone (the x86 quantizer refuses conv2d.padding)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.up(torch.relu(self.conv(x))))


class UnfoldedBN(nn.Module):
    """BatchNorms that stay in float: one with no conv before it, one after a 3-D linear
    (torchao does not fold that one and warns)."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(C)
        self.conv = nn.Conv2d(C, 4, 3, padding=1)
        self.fc = nn.Linear(W, W)
        self.bn = nn.BatchNorm1d(4 * H)

    def forward(self, x):
        return self.bn(self.fc(self.conv(self.bn_in(x)).flatten(1, 2)))


class TransposedWeight(nn.Module):
    """The linear reads ``weight.t()``: folding must quantize a computed constant."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(C * H * W, 10) * 0.02)

    def forward(self, x):
        return torch.nn.functional.linear(x.flatten(1), self.weight.t())


class BufferMutation(nn.Module):
    """Buffers updated in forward (a call counter, a running statistic) next to a conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, 8, 3, padding=1)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("last_mean", torch.zeros(()))
        self.register_buffer("gain", torch.ones(8, 1, 1))

    def forward(self, x):
        self.calls.add_(1)
        y = torch.relu(self.conv(x)) * self.gain
        self.last_mean.copy_(y.mean())
        self.gain.copy_(self.gain * 1.0)
        return y


class ReusedReLU(nn.Module):
    """One nn.ReLU called twice: X86InductorQuantizer fails on it after non-strict export."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(C, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


TEST_MODELS = {
    "conv_no_bias": ConvNoBias,
    "strided_depthwise": StridedDepthwise,
    "conv_bn": ConvBN,
    "mlp": MLP,
    "linear_bn": LinearBN,
    "residual": Residual,
    "pools": Pools,
    "relu6_two_users": ReLU6Hardtanh,
    "cat_branches": CatBranches,
    "batched_linear": BatchedLinear,
    "conv1d": Conv1d,
    "residual_in_place": ResidualInPlace,
    "conv_sigmoid": ConvSigmoid,
    "same_padding_transpose_bn": SamePaddingTransposeBN,
    "transpose_bn": TransposeBN,
    "unfolded_bn": UnfoldedBN,
    "transposed_weight": TransposedWeight,
    "buffer_mutation": BufferMutation,
    "reused_relu": ReusedReLU,
}


# --- Outside the matrices: a model for the refusals of the lowerings ---------------------------


class TwoConvs(nn.Module):
    """Two convs named ``a`` and ``b``: a quantizer can leave one of them in float."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(C, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


# --- Building them, reading their graphs -----------------------------------------------------


def build(name: str) -> nn.Module:
    """A zoo model, or a test-only model with seeded weights and trained-looking BatchNorm."""
    if name in MODEL_NAMES or name in TRANSFORMER_NAMES:
        return get_model(name)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TEST_MODELS[name]()
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
                n = module.num_features
                with torch.no_grad():
                    module.running_mean.copy_(torch.randn(n) * 0.1)
                    module.running_var.copy_(torch.rand(n) + 0.5)
                    module.weight.copy_(torch.rand(n) + 0.5)
                    module.bias.copy_(torch.randn(n) * 0.1)
    return model.eval()


def call_function_targets(gm) -> collections.Counter:
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


# --- Both partitioners on one graph: test_edge.py and test_atlas.py ----------------------------


class Partitioned(Exception):
    """Stops to_edge_transform_and_lower once both partitioners have tagged the graph."""


@functools.cache
def _both_partitioners() -> type:
    """``BothPartitioners``, made on first use: ExecuTorch is slow to import, and the modules
    that only build models (test_handmade.py, test_lowering.py) never ask for it. Ask for it
    after ``common.pt2e.quiet()``."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.utils.quant_utils import IS_IMPLICIT_Q_DQ_TAG
    from executorch.exir.backend.partitioner import Partitioner

    from common import edge

    class BothPartitioners(Partitioner):
        """Inside one ``to_edge_transform_and_lower``: asks both partitioners which ops to keep
        whole, then tags the edge graph with each in turn from the untagged graph, keeps what
        each tagged (and each one's ``NotImplementedError``, in ``refused``), and raises
        :class:`Partitioned` (the delegates' compilation, the slow part, is left to the
        runtime tests)."""

        def __init__(self):
            super().__init__()
            self.xnnpack, self.course = XnnpackPartitioner(), edge.CoursePartitioner()
            self.tagged, self.kept_whole, self.refused = {}, {}, None

        def ops_to_not_decompose(self, program):
            theirs, their_filter = self.xnnpack.ops_to_not_decompose(program)
            nodes = [n for n in program.graph.nodes if n.op == "call_function"]
            # the ops of this graph each keeps whole, and on which nodes
            self.kept_whole["xnnpack"] = [
                (n.name, n.target in theirs and their_filter(n)) for n in nodes
            ]
            try:
                mine, my_filter = self.course.ops_to_not_decompose(program)
                self.kept_whole["course"] = [
                    (n.name, n.target in mine and my_filter(n)) for n in nodes
                ]
            except NotImplementedError as error:
                self.refused = str(error)
            return theirs, their_filter

        def partition(self, program):
            for name, partitioner in (("xnnpack", self.xnnpack), ("course", self.course)):
                for node in program.graph.nodes:  # each starts from the untagged graph
                    node.meta.pop("delegation_tag", None)
                    node.meta.pop(IS_IMPLICIT_Q_DQ_TAG, None)
                try:
                    partitioner.partition(program)
                except NotImplementedError as error:
                    self.refused = self.refused or str(error)
                    continue
                groups = {}
                for node in program.graph.nodes:
                    if "delegation_tag" in node.meta:
                        groups.setdefault(node.meta["delegation_tag"], set()).add(node.name)
                folded = {n.name for n in program.graph.nodes if n.meta.get(IS_IMPLICIT_Q_DQ_TAG)}
                self.tagged[name] = (sorted(sorted(g) for g in groups.values()), folded)
            raise Partitioned

    return BothPartitioners


def __getattr__(name: str):
    """``from graphs import BothPartitioners`` imports ExecuTorch then, not with the models."""
    if name == "BothPartitioners":
        return _both_partitioners()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

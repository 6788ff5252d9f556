"""
M07-5 Rewrites that buy more int8
=================================

The coverage report of M07-1 and the atlas of M07-4 say which ops of your model stay float.
Five small rewrites change that without changing what the model computes: fold ConvNeXt's
layer scale into the linear before it, put the residual add right after its linear, replace
a ``ConvTranspose2d`` whose kernel equals its stride by a 1×1 conv and ``pixel_shuffle``,
give XNNPACK a 4-D mean with ``keepdim``, and drop the eval-mode dropout nodes an exported
``nn.TransformerEncoderLayer`` keeps. Each one makes more ops int8 (asserted, before and
after) and keeps the outputs (asserted); each is then compiled or lowered, and its kernels
read and timed. More int8 ops are not a faster model: inductor already computes the float
elementwise work inside the loops it runs anyway, and one rewrite is far slower on images
laid out the wrong way. A sixth gives each step of a GRU its own copy of the cell, whose
shared weights run float once compiled, and measures what int8 buys on a recurrent model.

**What you will learn**

- Six rewrites that turn float ops or kernels int8 under x86 or XNNPACK, and how to check
  that each keeps the outputs
- How to read, for each, which kernels ran and what the timing says
- Why more int8 ops need not run faster, the layout trap of a fused residual add, and why a
  recurrent model gains less from int8 than a conv net

**Prerequisites**: :ref:`M07-1 · what will my quantizer leave in float?
<sphx_glr_lessons_m07_your_model_m07_1_what_stays_float.py>`, :ref:`M07-4 · the op atlas
<sphx_glr_lessons_m07_your_model_m07_4_op_atlas.py>`, :ref:`M03-3 · speed and size, measured
<sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# Four small models with random weights (fixed seeds), each written the way the
# architecture's own code writes it: a ConvNeXt block, a U-Net's upsampling step, a 1-D
# keyword spotter and a GRU; the fifth is ``nn.TransformerEncoderLayer`` itself.
# ``quantized`` exports, prepares, calibrates on the example batch and converts.
# ``computing`` keeps a report's ops that compute (not the layout ops: views, permutes,
# slices), ``float_ops`` counts its float ones. ``verdict`` words what a timing says from
# the ratio of the two medians and its 95 % interval (``Timings.ratio_interval``, M03-3):
# the two models ran in the same interleaved rounds, so within this run a ratio whose
# interval excludes 1 is a difference; the next run may land elsewhere. It is printed, never
# asserted.

import copy
import hashlib
import warnings

import torch
from torch import nn

from common.coverage import MOVING_KINDS, coverage
from common.cpu import describe
from common.kernels import time_by_kind
from common.numerics import sqnr
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import as_compiled, compare_speed, race
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import to_executorch, xnnpack_quantizer
from common.runtime import operators_run

# inductor's int8 lowering copies a zero point with torch.tensor(tensor): a UserWarning
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
aten = torch.ops.aten

# The rows' labels, in the tables and the verdicts.
AS_WRITTEN, FOLDED, ADD_NEXT = "as written", "layer scale folded", "add next to linear"
TRANSPOSED, SHUFFLED = "ConvTranspose2d", "1×1 conv + pixel_shuffle"
MEAN_OVER_T, MEAN_4D = "mean over T", "4-D keepdim mean"
WITH_DROPOUT, NO_DROPOUT = "with dropout", "dropout removed"


def quantized(graph, args, quantizer):
    prepared = prepare_pt2e(copy.deepcopy(graph), quantizer)
    prepared(*args)  # calibration: the example batch
    return convert_pt2e(prepared)


def computing(report) -> dict:
    return {k: c for k, c in report.counts().items() if k not in MOVING_KINDS}


def float_ops(report) -> int:
    return sum(n - i for i, n in computing(report).values())


def show(label, report):
    counts = ", ".join(f"{k} {i}/{n}" for k, (i, n) in computing(report).items())
    print(f"{label}: {float_ops(report)} float ({counts})")


def verdict(timings, before: str, after: str) -> str:
    b, a = timings[before], timings[after]
    low, high = timings.ratio_interval(before, after)  # before ÷ after, both medians at worst
    medians = f"{b.median:.3f} → {a.median:.3f} ms ({low:.2f}–{high:.2f}×)"
    if low > 1:
        return f"{before} → {after}: {medians}, faster in this run"
    if high < 1:
        return f"{before} → {after}: {medians}, slower in this run"
    return f"{before} → {after}: {medians}, the interval holds 1×: no difference in this run"


# %%
# The ConvNeXt block: a 7×7 depthwise conv, then, channels last, LayerNorm, a linear to four
# times the width, GELU, a linear back, the learned per-channel layer scale ``gamma``, and the
# residual add in the input's layout. The two flags are the rewrites of Steps 1 and 2.
# x86's convs run channels-last, so the images are given channels-last (Step 2 shows why it
# matters here).


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim=32, *, layer_scale=True, add_next_to_linear=False):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pwconv1, self.act = nn.Linear(dim, 4 * dim), nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.1) if layer_scale else None
        self.add_next_to_linear = add_next_to_linear

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        if self.gamma is not None:
            y = self.gamma * y
        if self.add_next_to_linear:
            return (x.permute(0, 2, 3, 1) + y).permute(0, 3, 1, 2)
        return x + y.permute(0, 3, 1, 2)


torch.manual_seed(0)
block = ConvNeXtBlock().eval()
images = torch.randn(2, 32, 14, 14, generator=torch.Generator().manual_seed(1))
images = (images.contiguous(memory_format=torch.channels_last),)

# %%
# Step 1 — Fold the layer scale into the linear
# ---------------------------------------------
# As written, x86 leaves three ops of the block float: the LayerNorm, the residual add, and
# ``gamma * y``: x86 quantizes a ``mul`` only of two tensors of one shape, and ``gamma`` is a
# vector broadcast over the activations (M07-1, Step 3).

as_written = coverage(export_module(block, images), x86_quantizer(), every_op=True)
show(AS_WRITTEN, as_written)
print(as_written[as_written.names(kind="mul")[0]].why)
assert computing(as_written)["mul"] == (0, 1) and float_ops(as_written) == 3

# %%
# ``gamma`` multiplies each output channel of ``pwconv2``, so it can live in that linear's
# weight rows and bias: ``gamma * (W y + b) = (gamma[:, None] * W) y + gamma * b``. The
# folded block computes the same up to float rounding (tolerance 1e-6), and the ``mul`` is
# gone: one float op fewer.


def fold_layer_scale(model: ConvNeXtBlock) -> ConvNeXtBlock:
    folded = copy.deepcopy(model)
    with torch.no_grad():
        folded.pwconv2.weight.mul_(folded.gamma[:, None])
        folded.pwconv2.bias.mul_(folded.gamma)
    folded.gamma = None
    return folded


folded = fold_layer_scale(block)
torch.testing.assert_close(folded(*images), block(*images), rtol=0, atol=1e-6)
folded_report = coverage(export_module(folded, images), x86_quantizer(), every_op=True)
show(FOLDED, folded_report)
assert "mul" not in computing(folded_report) and float_ops(folded_report) == 2

# %%
# Step 2 — Put the residual add right after its linear
# ----------------------------------------------------
# The add is still float: x86 annotates an add only fused into the conv or linear that feeds
# it directly, and here a ``permute`` back to ``(N, C, H, W)`` sits between. Adding the
# residual channels-last, right after ``pwconv2``, and permuting the sum computes exactly the
# same numbers (``torch.equal``), and x86 fuses the add into the int8 linear.

next_to_linear = copy.deepcopy(folded)
next_to_linear.add_next_to_linear = True
assert torch.equal(next_to_linear(*images), folded(*images)), "the same sums, in another layout"
add_report = coverage(export_module(next_to_linear, images), x86_quantizer(), every_op=True)
show(ADD_NEXT, add_report)
print(add_report[add_report.names(kind="add")[0]].why)
assert computing(add_report)["add"] == (1, 1) and float_ops(add_report) == 1

# %%
# The converted graphs, before and after: in the first the add (highlighted) reads the
# linear's output through a permute; in the second it follows ``pwconv2`` directly, and no
# quantize node sits between the two: the pattern oneDNN runs as one kernel.

convnext_int8 = {
    AS_WRITTEN: quantized(export_module(block, images), images, x86_quantizer()),
    FOLDED: quantized(export_module(folded, images), images, x86_quantizer()),
    ADD_NEXT: quantized(export_module(next_to_linear, images), images, x86_quantizer()),
}


def adds(gm) -> list[str]:
    return [n.name for n in gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)]


def add_reads_linear(gm) -> bool:
    (add,) = gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)
    return any(getattr(arg, "target", None) == aten.linear.default for arg in add.args)


before_graph = convnext_int8[FOLDED]
draw(before_graph, highlight=adds(before_graph), title="x86: a permute between linear and add")
assert not add_reads_linear(before_graph), "a permute between"

# %%

after_graph = convnext_int8[ADD_NEXT]
draw(after_graph, highlight=adds(after_graph), title="x86: the add right after its linear")
assert add_reads_linear(after_graph), "the linear's output, straight into the add"

# %%
# Compiled with freezing and timed (``race``, M03-3). The three run the same oneDNN int8
# kernels: one conv, two linears, the first with GELU as its post-op; after Step 2 the
# second linear also runs the add as a post-op. No float conv or linear kernel runs in any
# of them. The table and the verdicts are this machine's, printed, never asserted.

convnext_race = race(convnext_int8, images)
print(convnext_race.table())
linear = "onednn::qlinear_pointwise"
for label, ran in convnext_race.kernels.items():
    assert ran.int8 == {"onednn::qconv_pointwise": 1, linear: 2} and not ran.float, label
    added = {"gelu": 1, "add": 1} if label == ADD_NEXT else {"gelu": 1}
    assert ran.post_ops[linear] == added, f"{label}: post-ops {ran.post_ops[linear]}"
print(verdict(convnext_race, AS_WRITTEN, FOLDED))
print(verdict(convnext_race, FOLDED, ADD_NEXT))

# %%
# Why two fewer float ops need not be faster: compiled, the float ``mul`` and ``add`` were
# never kernels of their own (the kernel lines show the same oneDNN calls in all three and
# no float kernel). Inductor computes them in the C++ loop it generates anyway to read the
# int8 linear's float output and write the block's result in the input's layout: one
# multiply and one add per value, in a pass over memory that happens either way
# (``TORCH_LOGS=output_code`` prints those loops).
#
# The layout trap: the fused add's other input must reach oneDNN laid out like the linear's
# output, one row per pixel. With images in PyTorch's default layout, ``(N, C, H, W)``
# contiguous, the residual ``x.permute(0, 2, 3, 1)`` is a transposed view, and oneDNN, which
# has no optimized int8 matmul for an add input laid out so, runs its reference code
# (``ref_int8``, read from oneDNN's log of the call: ``implementations``). Before Step 2 the
# add stays outside the linear, and the same images run its fast kernel:

standard = (images[0].contiguous(),)
assert not standard[0].permute(0, 2, 3, 1).is_contiguous(), "the residual arrives transposed"
trap_models = {k: convnext_int8[k] for k in (FOLDED, ADD_NEXT)}
trap = race(trap_models, standard, rounds=10)
print(trap.table())
for label, ran in trap.kernels.items():
    print(f"{label}: {dict(ran.implementations[linear])}")
print(verdict(trap, FOLDED, ADD_NEXT))
reference = {
    k: any(i.startswith("ref") for i in r.implementations[linear]) for k, r in trap.kernels.items()
}
assert reference == {FOLDED: False, ADD_NEXT: True}

# %%
# Step 3 — ConvTranspose2d as a 1×1 conv and pixel_shuffle
# --------------------------------------------------------
# A U-Net's decoder step: a stride-2 conv down (with ReLU), a ``ConvTranspose2d`` with kernel
# 2 and stride 2 back up, the skip concatenation, a 3×3 conv. x86 has no int8 transposed
# conv: ``conv_transpose2d`` is not in its op set, and stays float.


class UpStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.down, self.relu = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.out = nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.out(torch.cat([self.up(self.relu(self.down(x))), x], 1))


torch.manual_seed(0)
unet = UpStep().eval()
feature_map = torch.randn(2, 16, 32, 32, generator=torch.Generator().manual_seed(1))
feature_map = (feature_map.contiguous(memory_format=torch.channels_last),)
unet_report = coverage(export_module(unet, feature_map), x86_quantizer(), every_op=True)
show(TRANSPOSED, unet_report)
print(unet_report[unet_report.names(op="conv_transpose2d")[0]].why)
assert computing(unet_report)["conv"] == (2, 3), "the transposed conv is float"

# %%
# With kernel = stride = r (and no padding), each input pixel writes its own r×r block of
# the output: ``out[c, r·i + a, r·j + b] = Σ_k W[k, c, a, b] · x[k, i, j] + bias[c]``. That is
# a 1×1 conv to ``c · r²`` channels, whose channel ``c·r² + a·r + b`` ``pixel_shuffle(r)``
# moves to ``(c, r·i + a, r·j + b)``. ``as_pixel_shuffle`` builds it from the
# ``ConvTranspose2d``'s weights, and refuses any other transposed conv. Same outputs
# (tolerance 1e-5: the sums run in another order); x86 makes the new conv int8.


def as_pixel_shuffle(up: nn.ConvTranspose2d) -> nn.Sequential:
    r = up.stride[0]
    if not (
        up.kernel_size == up.stride == (r, r)
        and up.padding == up.output_padding == (0, 0)
        and up.dilation == (1, 1)
        and up.groups == 1
    ):
        raise ValueError(
            f"{up} is not a pixel shuffle: it needs kernel_size == stride (square), no padding "
            "or output_padding, dilation 1 and groups 1; keep this layer as it is"
        )
    cin, cout = up.in_channels, up.out_channels
    conv = nn.Conv2d(cin, cout * r * r, 1, bias=up.bias is not None)
    with torch.no_grad():  # W[k, c, a, b] -> conv weight [c·r² + a·r + b, k]
        conv.weight.copy_(up.weight.permute(1, 2, 3, 0).reshape(cout * r * r, cin, 1, 1))
        if up.bias is not None:
            conv.bias.copy_(up.bias.repeat_interleave(r * r))
    return nn.Sequential(conv, nn.PixelShuffle(r))


shuffled = copy.deepcopy(unet)
shuffled.up = as_pixel_shuffle(unet.up)
torch.testing.assert_close(shuffled(*feature_map), unet(*feature_map), rtol=0, atol=1e-5)
shuffle_report = coverage(export_module(shuffled, feature_map), x86_quantizer(), every_op=True)
show(SHUFFLED, shuffle_report)
assert computing(shuffle_report)["conv"] == (3, 3), "every conv int8"
assert shuffle_report.statuses("pixel_shuffle") == {"float": 1}

# %%
# One float op has become int8, and another float op has taken its place: ``pixel_shuffle``
# is not in x86's op set either, and so the ``cat`` after it still has a float input. What
# runs: before, oneDNN's float transposed conv (``mkldnn::_convolution_transpose_pointwise``)
# beside two int8 convs; after, three int8 convs and no float conv kernel.

unet_race = race(
    {
        TRANSPOSED: quantized(export_module(unet, feature_map), feature_map, x86_quantizer()),
        SHUFFLED: quantized(export_module(shuffled, feature_map), feature_map, x86_quantizer()),
    },
    feature_map,
)
print(unet_race.table())
before, after = unet_race.kernels.values()
assert before.int8["onednn::qconv_pointwise"] == 2
assert before.float == {"mkldnn::_convolution_transpose_pointwise": 1}
assert after.int8["onednn::qconv_pointwise"] == 3 and not after.float
print(verdict(unet_race, TRANSPOSED, SHUFFLED))

# %%
# The transposed conv was one float kernel on a small map; its int8 replacement adds a
# quantize before the new conv and keeps a float op after it, the ``pixel_shuffle``'s copy.
# The verdict above is what this machine measured.
#
# Step 4 — A 4-D mean with keepdim, for XNNPACK
# ---------------------------------------------
# A 1-D keyword spotter headed for a phone: two ``Conv1d`` + ReLU over 49 frames of 16
# features, the mean over time, a linear to 8 words. ``XNNPACKQuantizer`` annotates the
# ``mean`` int8 (it shares its input's qparams), but ``XnnpackPartitioner``'s ``mean.dim``
# config takes only a 4-D input averaged over its last two dims (H and W) with
# ``keepdim=True``; this mean, over the last axis of a 3-D tensor, runs on ExecuTorch's
# portable kernels, in float.


class TimeMean(nn.Module):
    def forward(self, x):  # (N, C, T) -> (N, C)
        return x.mean(-1)


class TimeMean4d(nn.Module):
    """The same mean as a 4-D one over H and W with keepdim: (N, C, 1, T) -> (N, C, 1, 1)."""

    def forward(self, x):
        n, c, t = x.shape
        return x.reshape(n, c, 1, t).mean((2, 3), keepdim=True).flatten(1)


class KeywordSpotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.relu1 = nn.Conv1d(16, 32, 5, padding=2), nn.ReLU()
        self.conv2, self.relu2 = nn.Conv1d(32, 32, 5, padding=2), nn.ReLU()
        self.pool, self.fc = TimeMean(), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc(self.pool(self.relu2(self.conv2(self.relu1(self.conv1(x))))))


torch.manual_seed(0)
spotter = KeywordSpotter().eval()
frames = (torch.randn(2, 16, 49, generator=torch.Generator().manual_seed(1)),)
spotter_4d = copy.deepcopy(spotter)
spotter_4d.pool = TimeMean4d()
torch.testing.assert_close(spotter_4d(*frames), spotter(*frames), rtol=0, atol=1e-6)

# %%
# The report (``every_op=True``) says what the partitioner will refuse; the ``reshape`` and
# the ``flatten`` only move values, and XNNPACK passes int8 through them.

spotters = {MEAN_OVER_T: spotter, MEAN_4D: spotter_4d}
xnnpack_reports = {}
for label, model in spotters.items():
    report = coverage(export_module(model, frames), xnnpack_quantizer(), every_op=True)
    show(label, report)
    print(f"  mean: {report[report.names(op='mean')[0]].why}")
    xnnpack_reports[label] = report
assert xnnpack_reports[MEAN_OVER_T].statuses("mean") == {"float": 1}
assert xnnpack_reports[MEAN_4D].statuses("mean") == {"int8 shared": 1}

# %%
# Lowered with ``XnnpackPartitioner`` and run once on the ExecuTorch runtime with an ETDump
# (``operators_run``, M06): before, one portable kernel runs, ``mean.out``, in float; after,
# none: every op runs inside XNNPACK, and no XNNPACK operator is named float (its mean and
# reshapes name no data type: the summary lists them apart). Both programs stay within 0.02 of
# the float model.

programs, methods = {}, {}
for label, model in spotters.items():
    int8 = quantized(export_module(model, frames), frames, xnnpack_quantizer())
    programs[label] = to_executorch(int8, frames, partitioner=XnnpackPartitioner()).buffer
    ran = operators_run(programs[label], frames)
    print(f"{label}:\n{ran.summary}")
    loaded = Runtime.get().load_program(programs[label])  # kept alive beside its method
    methods[label] = (loaded, loaded.load_method("forward"))
    (out,) = methods[label][1].execute(list(frames))
    torch.testing.assert_close(out, spotter(*frames), rtol=0, atol=0.02)
    assert not ran.float_only, f"{label}: no XNNPACK operator in float"
    assert ran.portable == ({"mean.out": 1} if label == MEAN_OVER_T else {}), ran.portable

# %%
# Timed on the runtime (one thread, interleaved rounds). The mean over 49 values is a small
# part of this model; the verdict is what this machine measured.

key = hashlib.sha256(b"".join(programs.values())).hexdigest()
spotter_timing = compare_speed(
    {label: lambda *x, m=method: m.execute(list(x)) for label, (_, method) in methods.items()},
    frames,
    rounds=100,
    key=key,
)
print(spotter_timing.table())
print(verdict(spotter_timing, MEAN_OVER_T, MEAN_4D))

# %%
# Step 5 — Drop the eval-mode dropout nodes
# -----------------------------------------
# ``nn.TransformerEncoderLayer`` (width 64, 4 heads) computes ``norm2(x + dropout2(linear2(
# ...)))``. In eval mode ``dropout2`` does nothing, but the exported graph keeps it as an
# ``aten.dropout`` node with ``train=False`` between ``linear2`` and the add, and x86's
# linear + add pattern needs the add right after the linear (M07-1, Step 4). A graph pass
# removes such nodes; a training-mode dropout would change the outputs, so it refuses one.

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
tokens = (torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1)),)
layer_graph = export_module(layer, tokens)


def drop_eval_dropout(graph: torch.fx.GraphModule) -> list[str]:
    """Remove every ``aten.dropout`` node with ``train=False`` (an identity); return their names."""
    removed = []
    for node in graph.graph.find_nodes(op="call_function", target=aten.dropout.default):
        if node.args[2] is not False:
            raise ValueError(
                f"{node.name} is a training-mode dropout (train={node.args[2]}); removing it "
                "changes the outputs: export the model in eval mode (model.eval()) first"
            )
        node.replace_all_uses_with(node.args[0])
        graph.graph.erase_node(node)
        removed.append(node.name)
    graph.recompile()
    return removed


no_dropout = copy.deepcopy(layer_graph)
print(drop_eval_dropout(no_dropout))
assert torch.equal(no_dropout(*tokens), layer_graph(*tokens)), "the dropouts were identities"

# %%
# The add after ``linear2`` becomes ``int8 fused``. The other add stays float: it follows the
# attention, whose output projection is an ``F.linear`` call inside ``nn.MultiheadAttention``
# that x86 does not annotate (M07-2 swaps the attention for one it does).

layer_reports = {}
for label, graph in ((WITH_DROPOUT, layer_graph), (NO_DROPOUT, no_dropout)):
    layer_reports[label] = coverage(graph, x86_quantizer(), every_op=True)
    show(label, layer_reports[label])
print(layer_reports[NO_DROPOUT].table(only="add"))
assert computing(layer_reports[WITH_DROPOUT])["add"] == (0, 2)
assert computing(layer_reports[NO_DROPOUT])["add"] == (1, 2)

# %%
# What runs is another matter. The two int8 models compute exactly the same outputs, and
# compiled they run the same kernels: inductor removes an eval-mode dropout itself, and its
# int8 linear fusions take a float add after an int8 linear as the kernel's add post-op
# whether or not the quantizer annotated it. The rewrite changed the report, not the
# program (the attention's two float linears are the float kernels of both).

layer_int8 = {
    WITH_DROPOUT: quantized(layer_graph, tokens, x86_quantizer()),
    NO_DROPOUT: quantized(no_dropout, tokens, x86_quantizer()),
}
same = torch.equal(layer_int8[WITH_DROPOUT](*tokens), layer_int8[NO_DROPOUT](*tokens))
assert same, "the int8 models compute the same"
layer_race = race(layer_int8, tokens)
print(layer_race.table())
with_dropout, without = layer_race.kernels.values()
assert with_dropout.int8 == without.int8 and with_dropout.float == without.float
assert with_dropout.post_ops == without.post_ops and with_dropout.post_ops[linear]["add"] == 1
assert sum(with_dropout.float.values()) == 2, "the attention's two linears, float"
print(verdict(layer_race, WITH_DROPOUT, NO_DROPOUT))

# %%
# Step 6 — Give each step of a recurrent model its own weights
# ------------------------------------------------------------
# A GRU written with ``nn.Linear``, as users write one: a cell computes the reset, update and
# candidate gates from two linears, one of the step's input and one of the hidden state, and
# the model calls that one cell at each of its steps, then a linear head. ``GRUPerStep`` is
# the fix of M07-4's Step 3: the same model with a copy of the cell for each step, so
# that each linear call reads an int8 weight of its own.


class GRUCell(nn.Module):
    def __init__(self, features=64, width=256):
        super().__init__()
        self.x_gates, self.h_gates = nn.Linear(features, 3 * width), nn.Linear(width, 3 * width)

    def forward(self, x, h):
        xr, xz, xn = self.x_gates(x).chunk(3, -1)
        hr, hz, hn = self.h_gates(h).chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1 - z) * torch.tanh(xn + r * hn) + z * h


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.head = GRUCell(), nn.Linear(256, 10)

    def forward(self, x, h):  # x: (N, steps, 64), h: (N, 256)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


class GRUPerStep(nn.Module):
    """``gru`` with a copy of its cell for each of ``steps`` steps."""

    def __init__(self, gru: GRU, steps: int):
        super().__init__()
        self.cells = nn.ModuleList(copy.deepcopy(gru.cell) for _ in range(steps))
        self.head = copy.deepcopy(gru.head)

    def forward(self, x, h):
        for t, cell in enumerate(self.cells):
            h = cell(x[:, t], h)
        return self.head(h)


# %%
# 8 steps over a batch of 128 sequences. The copies hold the same values: the same outputs,
# exactly.

STEPS = 8
torch.manual_seed(0)
gru = GRU().eval()
sequence = torch.randn(128, STEPS, 64, generator=torch.Generator().manual_seed(1))
gru_args = (sequence, torch.zeros(128, 256))
per_step = GRUPerStep(gru, STEPS).eval()
assert torch.equal(per_step(*gru_args), gru(*gru_args)), "the same cell's values at every step"

# %%
# One step, converted on its own: x86 makes both linears and the three muls int8 (each
# multiplies two tensors of one shape) and leaves the adds, the sigmoids and the tanh float.
# The int8 ops' inputs are quantized: the step's input, the hidden state it receives, and
# the values the muls multiply. The unrolled model does this at each of its steps.

cell_args = (sequence[:, 0], gru_args[1])
cell_graph = export_module(gru.cell, cell_args)
cell_report = coverage(cell_graph, x86_quantizer(), every_op=True)
show("one step", cell_report)
cell_ops = {"linear": (2, 2), "mul": (3, 3), "add": (0, 4), "activation": (0, 3)}
assert computing(cell_report) == cell_ops, "linears and muls int8; adds, sigmoids, tanh float"
cell_int8 = quantized(cell_graph, cell_args, x86_quantizer())
quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
quantizes = cell_int8.graph.find_nodes(op="call_function", target=quantize)
print(f"{len(quantizes)} quantize nodes in one step")
quantized_inputs = {n.args[0].name for n in quantizes if n.args[0].op == "placeholder"}
assert quantized_inputs == {"x", "h"}, "the step's input and the hidden state, quantized"

# %%
# Converted, every linear of both int8 models reads its weight through a dequantize node:
# int8 in the graph. Compiled with freezing and timed (``race``) beside fp32, they run other
# kernels. As written, only the head, read once, runs int8; the cell's two linears run float
# (``aten::addmm``) at every step, their weights each read by 8 linears. With a copy per
# step, every linear runs oneDNN's int8 kernel and none runs float.

GRU_FP32, SHARED, PER_STEP = "fp32", "int8, one cell", "int8, a cell per step"
gru_models = {
    GRU_FP32: export_module(gru, gru_args),
    SHARED: quantized(export_module(gru, gru_args), gru_args, x86_quantizer()),
    PER_STEP: quantized(export_module(per_step, gru_args), gru_args, x86_quantizer()),
}
dequantize_weight = torch.ops.quantized_decomposed.dequantize_per_channel.default
for label in (SHARED, PER_STEP):
    linears = gru_models[label].graph.find_nodes(op="call_function", target=aten.linear.default)
    assert {n.args[1].target for n in linears} == {dequantize_weight}, f"{label}: int8 linears"
gru_race = race(gru_models, gru_args, rounds=60)
print(gru_race.table())
ran_one, ran_per_step = gru_race.kernels[SHARED], gru_race.kernels[PER_STEP]
assert ran_one.int8 == {linear: 1}, "the head alone runs int8"
assert ran_one.float == {"aten::addmm": 2 * STEPS}, "the cell's linears, float at every step"
assert ran_per_step.int8 == {linear: 2 * STEPS + 1} and not ran_per_step.float, "all int8"

# %%
# Against fp32, the rewritten model run as a q/dq graph (uncompiled) stays above 30 dB SQNR
# (M01-1's bound: an error norm under 3 % of the output's). With VNNI, so do both compiled
# models. Without it, oneDNN's int8 linears add pairs of uint8 × int8 products in 16 bits,
# which can saturate, and the compiled models can fall far below (M04-2 measures it, and
# fixes it with ``reduce_range``); the CPU line of the table says which case this page was
# built on. Then the verdicts: fp32 against each int8 model, in the same rounds.

with as_compiled(gru_race.threads):  # as they were compiled, or they recompile (race)
    gru_float = gru(*gru_args)
    gru_sqnr = {"q/dq": sqnr(gru_float, gru_models[PER_STEP](*gru_args)).item()}
    gru_sqnr |= {
        k: sqnr(gru_float, gru_race.models[k](*gru_args)).item() for k in (SHARED, PER_STEP)
    }
    split = {label: time_by_kind(model, gru_args) for label, model in gru_race.models.items()}
print("; ".join(f"{label}: {db:.1f} dB" for label, db in gru_sqnr.items()))
assert gru_sqnr["q/dq"] > 30, "the q/dq model above 30 dB"
if describe().vnni:
    assert min(gru_sqnr.values()) > 30, "with VNNI, the compiled int8 models above 30 dB too"
print(verdict(gru_race, GRU_FP32, SHARED))
print(verdict(gru_race, GRU_FP32, PER_STEP))

# %%
# Where a call's time goes (``time_by_kind``, M03-3: the profiler splits a call into its int8
# kernels, its float ones and the rest), printed, never asserted:

for label, parts in split.items():
    print(f"{label}: " + ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in parts.items()))
fp32_split, int8_split = split[GRU_FP32], split[PER_STEP]
print(
    f"the linears alone: {fp32_split['float'] / int8_split['int8']:.2f}× faster in int8; "
    f"the rest: {fp32_split['other']:.2f} ms in fp32, {int8_split['other']:.2f} ms in int8"
)

# %%
# What bounds int8's gain on a recurrent model: the int8 kernels speed up the linears, and the
# linears are only part of a step, where a conv net's convs are most of its time (M03-3). Each
# step's two are small matrix products (128 rows by a 64×768 and a 256×768 weight); the rest
# of the step, counted in the ``other`` figure above, is the gates' adds, sigmoids and tanh,
# which stay float, and the quantize and dequantize of the step's input, its hidden state and
# the muls' inputs, which only the int8 models compute (inductor runs both in the loops it
# generates). Int8 kernels do nothing for that part, and the quantize work is extra work in
# it: the whole model gains less than its linears alone (compare their ratio with the second
# verdict). As written, the int8 model keeps its float linears and still quantizes: the first
# verdict says whether that made it slower than fp32 on this machine.

# %%
# Summary
# -------
# ================================  ==========================  ==============================
# rewrite                           int8, before → after        what ran
# ================================  ==========================  ==============================
# fold the layer scale (x86)        3 float → 2 (mul gone)      the same oneDNN kernels
# add right after its linear (x86)  2 float → 1 (add fused)     + the add as a post-op
# ConvTranspose2d → 1×1 + shuffle   conv 2/3 → 3/3              no float conv kernel left
# 4-D keepdim mean (XNNPACK)        mean float → int8           no portable kernel left
# drop eval-mode dropout (x86)      add 0/2 → 1/2               the same kernels, same outputs
# a GRU cell per step (x86)         linears int8 in both        addmm ×16 → qlinear ×17
# ================================  ==========================  ==============================
#
# Each rewrite keeps the outputs; the first five make more ops int8 in the quantizer's report,
# the sixth more kernels int8 once compiled. What that buys is what the timings above measured
# on this machine, for reasons the kernel lines show: the float ``mul`` and ``add`` were no
# kernels of their own, inductor computed them in loops it runs anyway; the transposed conv
# was one small float kernel, traded for a quantize and a float ``pixel_shuffle``; the mean is
# a sliver of the spotter's work; the dropout rewrite changed no kernel at all. The GRU's
# copies left every linear int8 in the graph, as before, and changed which kernels ran: its
# linears run int8, and around them run the gates and the quantize work, which int8 does not
# speed up. Rewrite for int8 where the op it makes int8 is heavy (a transposed conv on a large
# map, a mean XNNPACK would otherwise leave its delegate for), time it, and check the layout a
# fused kernel receives: a fused add fed a transposed residual runs oneDNN's reference code.
#
# Exercises
# ---------
# 1. Build the transformer layer with ``dropout=0.0`` instead of removing the nodes. Predict
#    x86's int8 adds.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          zero = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
#          zero_report = coverage(export_module(zero, tokens), x86_quantizer(), every_op=True)
#          assert computing(zero_report)["add"] == (0, 2), "p=0.0 still exports dropout nodes"
#
# 2. Give ``as_pixel_shuffle`` a ``ConvTranspose2d(32, 16, 3, stride=2, padding=1)``. Predict
#    what happens.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          from common.expect import expect_error
#
#          with expect_error(ValueError, match="kernel_size == stride"):
#              as_pixel_shuffle(nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1))
#
# 3. Lower the U-Net step for XNNPACK, as written and with Step 3's rewrite, and run both
#    (``operators_run``). Predict which of the two runs only int8 operators inside XNNPACK,
#    with nothing left to the portable kernels.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          for label, model in ((TRANSPOSED, unet), (SHUFFLED, shuffled)):
#              graph = export_module(model, feature_map)
#              int8 = quantized(graph, feature_map, xnnpack_quantizer())
#              pte = to_executorch(int8, feature_map, partitioner=XnnpackPartitioner()).buffer
#              ran = operators_run(pte, feature_map)
#              print(f"{label}:\n{ran.summary}")
#              rewritten = label == SHUFFLED
#              assert bool(ran.float_only) == bool(ran.portable) == rewritten, (
#                  "as written: XNNPACK's int8 transposed conv; rewritten: a float pixel_shuffle"
#              )
#
# Further reading
# ---------------
# - `X86InductorQuantizer source
#   <https://github.com/pytorch/ao/blob/main/torchao/quantization/pt2e/quantizer/x86_inductor_quantizer.py>`_
# - `inductor's int8 fusions (torch/_inductor/fx_passes/quantization.py)
#   <https://github.com/pytorch/pytorch/blob/main/torch/_inductor/fx_passes/quantization.py>`_
# - `XNNPACK partitioner configs
#   <https://github.com/pytorch/executorch/tree/main/backends/xnnpack/partition/config>`_
#
# Next
# ----
# M07 ends here; the :ref:`troubleshooting entries
# <sphx_glr_lessons_troubleshooting_m99_2_prepare_and_convert.py>` start from the errors a
# model of your own may raise.

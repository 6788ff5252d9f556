"""
Troubleshooting: lowering and speed
===================================

After ``convert_pt2e``: an int8 model slower than the float one, a lowered graph that fails
when run, and a transformer whose attention stays in float. Each entry is headed by the exact
first line of the message (or the symptom in a reader's words), reproduces it on this site's
stack (torch 2.13, torchao 0.18), shows the cause, asserts the fix, and links to the lesson
that explains it.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 2

# %%
# Setup
# -----
# ``small_cnn`` quantized with ``X86InductorQuantizer``, as the lowering lessons do.

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor import config as inductor_config

from common.expect import expect_error
from common.lowering import reshape_views
from common.models import example_inputs, get_model
from common.pt2e import export_module, quiet, x86_quantizer
from common.timing import compare_speed
from common.viz import draw

quiet()

from torchao.quantization.pt2e.lowering import lower_pt2e_quantized_to_x86
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

x = example_inputs(8)
floating = get_model("small_cnn")


def quantize(model, args) -> torch.fx.GraphModule:
    prepared = prepare_pt2e(export_module(model, args), x86_quantizer())
    with torch.no_grad():
        prepared(*args)
    return convert_pt2e(prepared)


simulated = quantize(floating, x)

# %%
# int8 is slower than float
# -------------------------
# The model that ``convert_pt2e`` returns runs slower than the float model it came from. The
# timings (one thread, interleaved rounds; printed, never asserted):

print(compare_speed({"fp32": floating, "int8 q/dq": simulated}, x, rounds=20).table())

# %%
# **Cause**, on the graph: nothing in it computes in int8. Each conv and linear still runs in
# float, between a dequantize and a quantize (highlighted) that only *simulate* int8 — extra
# work on top of the float model's.

floats = [
    n.name
    for n in simulated.graph.nodes
    if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
]
draw(simulated, highlight=floats, title="After convert_pt2e: float conv and linear between q/dq")
assert len(floats) == 2, "the conv and the linear still compute in float"

# %%
# **Fix**: lower the graph to int8 kernels. ``torch.compile`` does it only with
# ``torch._inductor.config.freezing = True``, which is off by default (that is the trap:
# without it the compiled int8 model is still simulated); eagerly,
# ``lower_pt2e_quantized_to_x86`` does it (and needs the fix of the next entry). Whether int8
# then beats fp32 depends on the model's size and on the CPU; see the measurements in
# :ref:`M03-3 · Speed and size, measured <sphx_glr_lessons_m03_lowering_m03_3_speed_and_size.py>`.

assert inductor_config.freezing is False, "freezing is off unless you turn it on"
lowered = lower_pt2e_quantized_to_x86(simulated, x)
reshape_views(lowered)
int8_ops = [n.name for n in lowered.graph.nodes if "onednn" in str(n.target)]
print(f"int8 kernels: {int8_ops}")
assert len(int8_ops) == 2, "the conv and the linear now run as oneDNN int8 kernels"
print(
    compare_speed(
        {"fp32": floating, "int8 q/dq": simulated, "int8 lowered": lowered}, x, rounds=20
    ).table()
)

# %%
# RuntimeError: view size is not compatible with input tensor\'s size and stride
# ------------------------------------------------------------------------------
# A graph lowered by ``lower_pt2e_quantized_to_x86`` fails when run eagerly, if a ``flatten``
# follows an int8 conv (torchao 0.18). The message goes on: "(at least one dimension spans
# across two contiguous subspaces). Use .reshape(...) instead."

failing = lower_pt2e_quantized_to_x86(simulated, x)
with expect_error(RuntimeError, match="view size is not compatible"):
    failing(*x)

# %%
# **Cause**, on the graph: oneDNN's int8 conv returns a **channels-last** tensor (NHWC in
# memory); the ``view`` that ``flatten`` was traced to (highlighted) cannot regroup an NHWC
# tensor without copying. ``torch.compile`` chooses its own layouts and is not affected.

views = failing.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default)
draw(failing, highlight=[n.name for n in views], title="The view after the int8 conv")
assert len(views) == 1

# %%
# **Fix**: replace each ``view`` by a ``reshape``, which copies only when it must
# (``common.lowering.reshape_views``); the values are the same. Explained in
# :ref:`M03-1 · The lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.

print(f"changed: {reshape_views(failing)}")
assert torch.equal(failing(*x), lowered(*x)), "the fixed graph runs, and gives the same values"

# %%
# A transformer's attention stays float
# -------------------------------------
# Quantized with the default x86 config, an ``nn.TransformerEncoderLayer`` gets int8 weights
# in its two feed-forward linears only; the attention's projections stay float.

tokens = (torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(0)),)
torch.manual_seed(0)
encoder = quantize(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval(), tokens)


def linears(gm) -> dict[str, bool]:
    """Each linear node: does its weight come through a dequantize (int8), or stay float?"""
    return {
        n.name: "dequantize" in str(n.args[1].target)
        for n in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    }


print(f"int8 weight per linear: {linears(encoder)}")
assert list(linears(encoder).values()) == [False, False, True, True], "attention's stay float"

# %%
# **Cause**, on the graph: ``nn.MultiheadAttention`` calls ``F.linear`` with its packed
# ``in_proj_weight``, and its ``out_proj`` is called the same way, inside the attention's
# ``forward``: the quantizer looks for ``nn.Linear`` modules and finds only
# ``MultiheadAttention`` in those nodes' ``nn_module_stack``.

for node in encoder.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
    print(node.name, "from", list(node.meta["nn_module_stack"].values())[-1][1])

# %%
# **Fix**: write the attention with an ``nn.Linear`` per projection and
# ``F.scaled_dot_product_attention``; all four projections then get int8 weights. Explained in
# :ref:`M02-1 · What a quantizer writes
# <sphx_glr_lessons_m02_by_hand_m02_1_what_a_quantizer_writes.py>`.


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


attention = quantize(Attention().eval(), tokens)
print(f"int8 weight per linear: {linears(attention)}")
assert all(linears(attention).values()) and len(linears(attention)) == 4

# %%
# Next
# ----
# :ref:`Troubleshooting: accuracy, eval and QAT
# <sphx_glr_lessons_troubleshooting_m99_4_accuracy_and_qat.py>`.

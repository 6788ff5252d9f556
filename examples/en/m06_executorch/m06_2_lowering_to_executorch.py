"""
M06-2 Lowering to ExecuTorch
============================

A converted graph still simulates int8 in float. ExecuTorch makes it real in two moves:
``to_edge_transform_and_lower`` rewrites the graph in the **edge dialect** and hands the parts
a backend can run to that backend's **partitioner**, which cuts them out as delegates;
``.to_executorch()`` then plans the memory of everything that is left. This lesson lowers a
small classifier with ExecuTorch's ``XnnpackPartitioner``, reads which nodes became XNNPACK
delegates and which stayed on ExecuTorch's portable kernels (and why, from the partitioner's
own constraints), then writes a partitioner by hand, ``common.edge.CoursePartitioner``, that
delegates exactly the same nodes — and the two programs give equal outputs on the runtime.

**What you will learn**

- What the edge dialect is, and which nodes become ``executorch_call_delegate`` calls of a
  ``lowered_module_N``
- Why a node stays on the portable kernels, read from the partitioner's constraint, and what
  memory planning adds (``alloc``, ``.out`` ops)
- What a partitioner does: tag nodes, say which ops not to decompose

**Prerequisites**:
:ref:`M06-1 · The XNNPACK quantizer <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`,
:ref:`M03-1 · The lowered graph <sphx_glr_lessons_m03_lowering_m03_1_lowered_graph.py>`.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# A classifier in miniature: conv + relu, a global average over height and width written as
# ``mean((2, 3))``, and a linear layer; quantized with ``XNNPACKQuantizer`` (int8 activations,
# per-channel int8 weights: ``common.edge.xnnpack_quantizer()``) and exported again, since
# ExecuTorch starts from an ``ExportedProgram``.

import contextlib
import io
from collections import Counter

import torch
from torch import nn

from common.expect import expect_error
from common.models import example_inputs
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.config.generic_node_configs import MeanDimConfig
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import (
    SUPPORTED,
    CoursePartitioner,
    delegated,
    left_outside,
    xnnpack_quantizer,
)


class Classifier(nn.Module):
    def __init__(self, keepdim=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)
        self.keepdim = keepdim

    def forward(self, x):
        features = torch.relu(self.conv(x)).mean((2, 3), keepdim=self.keepdim)
        return self.fc(features.flatten(1))


x = example_inputs(2)


def quantized_program(model, quantizer=None):
    """prepare -> calibrate -> convert with XNNPACKQuantizer, then torch.export again."""
    prepared = prepare_pt2e(export_module(model, x), quantizer or xnnpack_quantizer())
    calibrate(prepared)
    return torch.export.export(convert_pt2e(prepared), x)


torch.manual_seed(0)
program = quantized_program(Classifier().eval())

# %%
# Two helpers: ``ops`` counts a graph's operators by short name, and ``run`` runs a program on
# the ExecuTorch runtime (the runtime prints a few ``cpuinfo`` lines when it first loads;
# they are kept off the page).


def ops(gm) -> Counter:
    """Operator name (without namespace and overload) -> how many call_function nodes call it."""
    names = (
        str(getattr(n.target, "__name__", n.target))
        for n in gm.graph.nodes
        if n.op == "call_function"
    )
    return Counter(name.split(".")[-2] if "." in name else name for name in names)


def run(executorch_program, inputs):
    with contextlib.redirect_stderr(io.StringIO()):
        program = Runtime.get().load_program(executorch_program.buffer)
        method = program.load_method(
            "forward"
        )  # a Method does not keep its Program alive: hold both
    return method.execute([*inputs])[0]


# %%
# Step 1 — Lower with XnnpackPartitioner
# --------------------------------------
# ``to_edge_transform_and_lower`` does three things: it converts the ATen graph to the edge
# dialect, asks each partitioner which nodes its backend runs, and replaces each group of
# those nodes by one ``executorch_call_delegate`` call. Here two groups were cut out: the conv
# (with its relu) and the linear. Between them one op stayed: the ``mean`` (a ``getitem``
# reads each delegate's output).

edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
lowered = edge.exported_program()
calls = [n.name for n in lowered.graph.nodes if n.name.startswith("executorch_call_delegate")]
draw(lowered.graph_module, highlight=calls, title="After: two XNNPACK delegates")
print(dict(ops(lowered.graph_module)))
assert ops(lowered.graph_module)["executorch_call_delegate"] == 2, "two delegates"
assert not ops(lowered.graph_module)["convolution"], "no conv left outside a delegate"

# %%
# Step 2 — The edge dialect, inside each delegate
# -----------------------------------------------
# Each ``executorch_call_delegate`` reads a ``get_attr`` of ``lowered_module_N``: the XNNPACK
# program compiled from the nodes it replaced. Their edge-dialect graph is kept in
# ``original_module``. Edge ops are ATen ops with a dtype contract (``EdgeOpOverload``);
# ``conv2d`` is now the core ``convolution`` (the edge dialect has no views either: a
# ``flatten`` becomes a ``view_copy``, as in Exercise 1). ``linear`` stayed whole:
# XnnpackPartitioner asked ExecuTorch not to decompose it (Step 5).

for module, names in delegated(lowered).items():
    print(f"{module}: {names}")
inner = lowered.graph_module.lowered_module_0.original_module.graph_module
conv = next(n for n in inner.graph.nodes if "convolution" in n.name)
draw(inner, highlight=[conv.name], title="Inside lowered_module_0: its nodes in the edge dialect")
print(type(conv.target).__name__, conv.target)
assert type(conv.target).__name__ == "EdgeOpOverload"
assert {"aten_convolution_default", "aten_relu_default"} <= set(
    delegated(lowered)["lowered_module_0"]
)
assert "aten_linear_default" in delegated(lowered)["lowered_module_1"], "linear kept whole"

# %%
# Step 3 — What stayed on the portable kernels, and why
# -----------------------------------------------------
# The mean runs on ExecuTorch's **portable kernels** (plain C++ loops), in float: the first
# delegate ends with the quantize and the dequantize that surrounded the mean (XNNPACK takes
# a lone q or dq too), the second begins with the next quantize. XNNPACK's partitioner has a
# config per op; its ``MeanDimConfig`` lowers a mean to XNNPACK's global average pooling, whose
# output keeps H and W as 1×1: it accepts a mean over dims 2 and 3 of a 4-D tensor **with**
# ``keepdim=True`` only. Ours drops them (``keepdim`` defaults to False).

portable = ops(lowered.graph_module) - Counter(executorch_call_delegate=2, getitem=2)
(mean,) = [n for n in lowered.graph.nodes if n.name.startswith("aten_mean")]
print(f"portable: {dict(portable)}; args: {mean.args[1:]}, {mean.kwargs}")
print("why: " + SUPPORTED["mean.dim"].why_not(mean))
assert portable == Counter(mean=1), "only the mean stayed outside the delegates"
assert not MeanDimConfig().check_constraints(mean, lowered), "XNNPACK's own check refuses it"
assert mean.meta["val"].dtype == torch.float32, "it runs in float, between the delegates"

# %%
# On your own model, ``common.edge.left_outside`` lists every op a lowered program runs
# outside its delegates, each with the reason from the course's table of XNNPACK's
# partitioner: the constraint it fails, or that XNNPACK has no config for it.

outside = left_outside(lowered)
print(outside)
why = "mean.dim: " + SUPPORTED["mean.dim"].why_not(mean)
assert outside == {mean.name: why}, "one op outside, for this reason"

# %%
# Step 4 — ``.to_executorch()``: memory planning
# ----------------------------------------------
# ``.to_executorch()`` turns every op left outside the delegates into its **out variant**
# (``mean.out`` writes into a tensor it is given, it never allocates), adds a
# ``memory.alloc`` node for that tensor, and plans where every intermediate tensor lives in
# one preallocated buffer: ``meta["spec"]`` holds its ``mem_id`` and ``mem_offset``. Tensors
# whose lifetimes do not overlap share bytes: the conv's output is dead once the mean has read
# it, so the linear's output takes its offset. The result serializes to a ``.pte`` file
# (M06-3) and runs on the ExecuTorch runtime.

executorch_program = edge.to_executorch()
planned = executorch_program.exported_program().graph_module
print(dict(ops(planned)))
(mean_out,) = [n for n in planned.graph.nodes if str(n.target).endswith("mean.out")]
print(f"{mean_out.name}: out={mean_out.kwargs['out'].name}")
offsets = {}
for node in planned.graph.nodes:
    spec = node.meta.get("spec")
    if node.op == "call_function" and getattr(spec, "mem_offset", None) is not None:
        offsets[node.name] = spec.mem_offset
        print(f"  {node.name:14} shape {tuple(spec.shape)!s:15} mem_id {spec.mem_id}", end="")
        print(f"  offset {spec.mem_offset}")
assert mean_out.kwargs["out"].target.__name__ == "alloc", "the mean writes into a planned buffer"
assert ops(planned)["alloc"] == 1, "one alloc: the only op outside the delegates"
assert offsets["getitem_1"] == offsets["getitem"], "a dead tensor's bytes are reused"
y = run(executorch_program, x)
print("runtime output", tuple(y.shape), y.dtype)

# %%
# Step 5 — A partitioner written by hand
# --------------------------------------
# A partitioner is a class with two methods. ``ops_to_not_decompose(program)`` returns the
# ATen ops the backend wants whole, and a filter choosing the nodes (ExecuTorch decomposes
# the rest). ``partition(program)`` sets ``node.meta["delegation_tag"]`` on the nodes to
# delegate. ``common.edge.CoursePartitioner`` keeps its knowledge in one table, ``SUPPORTED``:
# each op XNNPACK runs, whether it has an int8 kernel, and the constraint read from XNNPACK's
# config for it. An int8 op takes its dequantized inputs and its output quantize along.

for name in ("convolution.default", "mean.dim", "max_pool2d.default", "sigmoid.default"):
    op = SUPPORTED[name]
    print(f"{name:20} int8={op.int8!s:5} keep whole={op.keep_whole}  fuses {op.fused}")
mine = to_edge_transform_and_lower(program, partitioner=[CoursePartitioner()])
print({module: len(names) for module, names in delegated(mine.exported_program()).items()})
assert delegated(mine.exported_program()) == delegated(lowered), "the same delegates"

# %%
# Same delegates, same program: on the runtime both give the same numbers, bit for bit.

y_mine = run(mine.to_executorch(), x)
assert torch.equal(y_mine, y), "CoursePartitioner's program gives XnnpackPartitioner's output"
print(f"equal: {torch.equal(y_mine, y)}")

# %%
# Step 6 — What it does not know, it refuses
# ------------------------------------------
# A partitioner that silently skipped an op it does not know would give a different program
# without a word. ``CoursePartitioner`` raises instead, naming the node. XNNPACK runs
# ``prelu`` (and asks to keep it whole); the table does not have it.


class PReLUHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.PReLU()

    def forward(self, x):
        return self.act(self.conv(x))


with expect_error(NotImplementedError, match="does not know prelu"):
    to_edge_transform_and_lower(
        quantized_program(PReLUHead().eval()), partitioner=[CoursePartitioner()]
    )

# %%
# It checks what it is given, too: a ``GraphModule`` (what ``convert_pt2e`` returns) is not a
# program yet.

with expect_error(TypeError, match="expects an ExportedProgram, got a GraphModule"):
    CoursePartitioner().partition(program.module())

# %%
# Summary
# -------
# ===============================  ==========================================================
# Stage                            What it holds
# ===============================  ==========================================================
# ``to_edge_transform_and_lower``  edge-dialect ops; each partition one
#                                  ``executorch_call_delegate`` of a ``lowered_module_N``
# outside the delegates            ops the partitioner refused (``mean`` without
#                                  ``keepdim``), in float, on the portable kernels
# ``.to_executorch()``             ``.out`` variants, a ``memory.alloc`` for each of their
#                                  outputs, offsets in one planned buffer
# a partitioner                    ``ops_to_not_decompose`` + ``partition`` (tags)
# ===============================  ==========================================================
#
# Exercises
# ---------
# 1. Build ``Classifier(keepdim=True)`` instead. Predict how many delegates the lowered
#    program has, and whether any ``mean`` is left outside them.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          kept = quantized_program(Classifier(keepdim=True).eval())
#          kept_lowered = to_edge_transform_and_lower(
#              kept, partitioner=[CoursePartitioner()]
#          ).exported_program()
#          print(dict(ops(kept_lowered.graph_module)))
#          assert ops(kept_lowered.graph_module)["executorch_call_delegate"] == 1
#          assert not ops(kept_lowered.graph_module)["mean"], "the mean joined the delegate"
#          (names,) = delegated(kept_lowered).values()
#          assert "aten_view_copy_default" in names, "flatten is a view_copy in the edge dialect"
#
# 2. Leave the linear in float: ``set_filter_function`` tells ``XNNPACKQuantizer`` which nodes
#    to annotate. Predict what each partitioner does with the float linear.
#
#    .. dropdown:: Solution
#
#       .. code-block:: python
#
#          torch.manual_seed(0)
#          all_but_linear = xnnpack_quantizer().set_filter_function(
#              lambda node: node.target != torch.ops.aten.linear.default
#          )
#          float_fc = quantized_program(Classifier().eval(), all_but_linear)
#          theirs = to_edge_transform_and_lower(float_fc, partitioner=[XnnpackPartitioner()])
#          assert any(
#              "aten_linear_default" in names
#              for names in delegated(theirs.exported_program()).values()
#          ), "XNNPACK delegates it as a float GEMM"
#          mine = to_edge_transform_and_lower(float_fc, partitioner=[CoursePartitioner()])
#          assert delegated(mine.exported_program()) == delegated(
#              theirs.exported_program()
#          ), "CoursePartitioner delegates it alike"
#
# Further reading
# ---------------
# - `ExecuTorch: Lowering a model to XNNPACK
#   <https://docs.pytorch.org/executorch/stable/tutorial-xnnpack-delegate-lowering.html>`_
# - `ExecuTorch: Backend delegate and partitioner
#   <https://docs.pytorch.org/executorch/stable/compiler-delegate-and-partitioner.html>`_
# - `ExecuTorch: Memory planning
#   <https://docs.pytorch.org/executorch/stable/compiler-memory-planning.html>`_
#
# Next
# ----
# :ref:`M06-3 · The .pte, inside out
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` opens the file this program
# serializes to, runs it and measures it.

"""
Troubleshooting: ExecuTorch and XNNPACK
=======================================

After ``convert_pt2e``, on the way to a ``.pte`` and on the ExecuTorch runtime: a program that
will not emit, a delegate that will not load, a process that dies without a Python error,
a dynamic model whose weights were never measured, and a language model whose KV cache stops
``to_executorch()`` when it was exported with grad on. Each entry is headed by the exact
first line of the message (or the symptom in a reader's words) and reproduces it on this
site's stack (torch 2.13, torchao 0.18, executorch 1.5.1); an error readers reported on an
older release that no longer happens here says so, and shows it. Each entry shows the cause,
asserts the fix, and links to the lesson that explains it.

**Prerequisites**: none; each entry links to the lesson that explains it.
"""

# SPDX-License-Identifier: BSD-3-Clause
# sphinx_gallery_thumbnail_number = 1

# %%
# Setup
# -----
# ``XNNPACKQuantizer`` with per-channel weights (as M06 uses it), the lowering of M06-2
# (``to_edge_transform_and_lower`` with ``XnnpackPartitioner``, then ``to_executorch()``)
# and a ``run`` that loads a ``.pte`` on the ExecuTorch runtime. The runtime logs what it reads
# about the CPU, and why a delegate failed, to stderr: ``run`` keeps that log off the page and
# hands it back.

import contextlib
import copy
import io
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from common.expect import expect_error
from common.pt2e import export_module, quiet
from common.viz import draw

quiet()

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.runtime import Runtime
from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerGroup
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from common.edge import delegated, to_executorch
from common.runtime import load_check, operators_run

qd = torch.ops.quantized_decomposed


def quantized(model, args, *, calibrate=True, **options) -> torch.fx.GraphModule:
    """``model`` through ``XNNPACKQuantizer``: prepared, run once on ``args``, converted."""
    config = get_symmetric_quantization_config(is_per_channel=True, **options)
    prepared = prepare_pt2e(export_module(model, args), XNNPACKQuantizer().set_global(config))
    if calibrate:
        with torch.no_grad():
            prepared(*args)
    return convert_pt2e(prepared)


def lowered(model, args):
    """M06-2's lowering: the XNNPACK delegates, then the ExecuTorch program."""
    program = torch.export.export(model, args)
    return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()


def run(pte: bytes, args, log: io.StringIO | None = None) -> torch.Tensor:
    """Load ``pte`` on the ExecuTorch runtime and run ``forward``; its log goes to ``log``."""
    with contextlib.redirect_stderr(log or io.StringIO()):
        program = Runtime.get().load_program(pte)
        method = program.load_method("forward")  # ``program`` lives as long as ``method`` runs
        return method.execute(list(args))[0]


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


torch.manual_seed(0)
net = SmallNet().eval()
x = (torch.randn(2, 3, 8, 8),)
qdq = quantized(net, x)

# %%
# RuntimeError: Missing out variants
# ----------------------------------
# A quantized program with nothing delegated — ``to_edge(...)`` then ``.to_executorch()``,
# no partitioner — fails to emit. The message goes on with the set of quantize and dequantize
# ops, in an order that changes from run to run:
# ``{'quantized_decomposed::dequantize_per_tensor', ...}`` (executorch#1263, #7775, #8369).

edge = to_edge(torch.export.export(qdq, x))
with expect_error(RuntimeError, match="Missing out variants") as caught:
    edge.to_executorch()

# %%
# **Cause**: ``to_executorch()`` replaces every op by its *out variant*, the kernel that
# writes into memory the planner laid out, looked up among the kernels registered in this
# process. The portable kernels cover ``aten``; the out variants of the q/dq ops live in a
# library of their own, ``executorch.kernels.quantized``, which nothing has loaded. The
# missing ops are exactly the q/dq ops of the graph:

missing = set(re.findall(r"'([\w:]+)'", caught.message))
in_graph = {
    f"quantized_decomposed::{n.target.__name__.split('.')[0]}"
    for n in qdq.graph.nodes
    if n.op == "call_function" and "quantized_decomposed" in str(n.target)
}
print(f"missing: {sorted(missing)}")
assert missing == in_graph, "the graph's quantize and dequantize ops, and nothing else"

# %%
# **Fix**: lower with ``XnnpackPartitioner``: the q/dq nodes then go into the XNNPACK
# delegates, which run them as int8 tensors, and no q/dq kernel is emitted
# (:ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`). To run the q/dq graph
# on the portable kernels instead (op for op as the q/dq model computes it),
# ``import executorch.kernels.quantized`` registers the out variants.

delegate = lowered(qdq, x)
assert (run(delegate.buffer, x) - qdq(*x)).abs().max() < 0.05, "XNNPACK: close to the q/dq model"
with contextlib.redirect_stderr(io.StringIO()):
    import executorch.kernels.quantized
portable = edge.to_executorch()
assert torch.equal(run(portable.buffer, x), qdq(*x)), "portable kernels: the q/dq model's values"

# %%
# RuntimeError: Missing out variants: {\'torchao::dequantize_affine\'}
# --------------------------------------------------------------------
# A model quantized with torchao's ``quantize_`` weight-only (here int8 weights,
# ``IntxWeightOnlyConfig``) and given to ``to_edge`` with no partitioner fails to emit too, and
# ``executorch.kernels.quantized``, now loaded, does not help (executorch#10663).

torch.manual_seed(0)
linear = nn.Sequential(nn.Linear(64, 32)).eval()
weight_only = copy.deepcopy(linear)
quantize_(weight_only, IntxWeightOnlyConfig())
tokens = (torch.randn(2, 64),)
weight_only_program = torch.export.export(weight_only, tokens)
with expect_error(RuntimeError, match="Missing out variants: {'torchao::dequantize_affine'}"):
    to_edge(weight_only_program).to_executorch()

# %%
# **Cause**: ``quantize_`` swaps the weight for a tensor subclass; export writes its
# dequantization as ``torchao.dequantize_affine``, torchao's op, not the
# ``quantized_decomposed`` ops of PT2E, and no ExecuTorch kernel library has an out variant
# for it: only a delegate can run it.

ops = {str(n.target) for n in weight_only_program.graph.nodes if n.op == "call_function"}
print(sorted(ops))
assert "torchao.dequantize_affine.default" in ops, "torchao's own dequantize op"

# %%
# **Fix**: lower with ``XnnpackPartitioner`` a recipe it reads. Its partitioner takes
# torchao's ``choose_qparams_affine``, ``quantize_affine`` and ``dequantize_affine`` as it takes
# PT2E's q/dq ops, with int8 activations quantized at run time: ``quantize_`` with
# ``Int8DynamicActivationIntxWeightConfig`` (int8 dynamic activations, 4- or 8-bit weights; here
# 4 bits in groups of 32), the recipe of ExecuTorch's own LLM export. The whole program goes
# into one delegate, and on the runtime it computes what the ``quantize_`` model computes in
# eager, within 0.01 (its 4-bit weights alone move the output ten times as far from the float
# linear).

llm_recipe = copy.deepcopy(linear)
quantize_(
    llm_recipe,
    Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
)
llm_program = lowered(llm_recipe, tokens)
outside = [
    str(n.target) for n in llm_program.exported_program().graph.nodes if n.op == "call_function"
]
(inside,) = delegated(llm_program.exported_program()).values()
with torch.no_grad():
    eager, float_out = llm_recipe(*tokens), linear(*tokens)
error = (run(llm_program.buffer, tokens) - eager).abs().max().item()
rounding = (eager - float_out).abs().max().item()
print(f"outside the delegate: {outside}")
print(f"inside: {inside}")
print(f"runtime vs quantize_ eager: {error:.5f}; quantize_ int4 vs float: {rounding:.5f}")
assert set(outside) == {"executorch_call_delegate", "<built-in function getitem>"}, "whole"
assert "aten_linear_default" in inside and any("dequantize_affine" in n for n in inside)
assert error < 0.01 < rounding, "the runtime computes the quantize_ model, within 0.01"

# %%
# Or quantize with PT2E and ``XNNPACKQuantizer``, whose q/dq ops XNNPACK's partitioner takes
# into its delegates (the previous entry); ``is_dynamic=True`` is the same kind of recipe,
# with int8 weights only. How a partitioner chooses its nodes is
# :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.

dynamic_linear = quantized(linear, tokens, is_dynamic=True)
error = (run(lowered(dynamic_linear, tokens).buffer, tokens) - dynamic_linear(*tokens)).abs()
print(f"PT2E dynamic on XNNPACK, largest difference from its q/dq model: {error.max():.5f}")
assert error.max() < 0.01, "the delegate computes what the q/dq model does"

# %%
# Not weight-only: ``XnnpackPartitioner`` also takes the weight-only model's
# ``dequantize_affine`` → ``linear`` into a delegate, and that program emits and runs; but on
# this stack its outputs are far from the ``quantize_`` model's. They are the input times the
# raw int8 weights plus the bias: the delegate drops the weights' scales. Check the values
# before you ship such a program.

weight = weight_only[0].weight  # torchao's tensor subclass: int8 ``qdata``, one scale a row
out = run(lowered(weight_only, tokens).buffer, tokens)
error = (out - weight_only(*tokens)).abs().max().item()
print(f"quantize_ on XNNPACK, largest difference from the quantize_ model: {error:.1f}")
unscaled = tokens[0] @ weight.qdata.float().T + weight_only[0].bias
assert error > 1 and torch.allclose(out, unscaled, atol=1e-3), "the int8 values, unscaled"

# %%
# AttributeError: \'OutDtypeOperator\' object has no attribute \'_schema\'
# ------------------------------------------------------------------------
# ``convert_pt2e(prepared, use_reference_representation=True)`` writes the quantized patterns
# it knows as the integer arithmetic they stand for. Such a model exports and goes through
# ``to_edge_transform_and_lower``; ``to_executorch()`` then fails (pytorch/pytorch#139718,
# executorch#6685). Here the setup's ``SmallNet``, with per-tensor weights:


def reference(model, args, *, per_channel: bool) -> torch.fx.GraphModule:
    """``model`` through ``XNNPACKQuantizer``, converted to the reference representation."""
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    prepared = prepare_pt2e(export_module(model, args), XNNPACKQuantizer().set_global(config))
    prepared(*args)
    with warnings.catch_warnings():  # the rewrite calls a pytree API torch 2.13 deprecates
        warnings.filterwarnings("ignore", r"`treespec\.children_specs`", FutureWarning)
        return convert_pt2e(prepared, use_reference_representation=True)


integer = reference(net, x, per_channel=False)
with expect_error(AttributeError, match="'OutDtypeOperator' object has no attribute '_schema'"):
    lowered(integer, x)

# %%
# **Cause**: the rewrite computes the linear's int32 product, its bias and its rescaling with
# ``out_dtype``, a higher-order op (it takes the op to run as its first argument), which has
# no schema. ``to_executorch()`` replaces every op left outside the delegates by its out
# variant (``ToOutVarPass``, ``executorch/exir/passes/__init__.py``) and reads each op's
# ``_schema``; it steps into ``cond``, ``map``, ``while_loop`` and ``scan``, and has no case
# for ``out_dtype``. Per-channel weights do not save the model: an int8 add + ReLU is written
# with ``out_dtype`` under any config, as in the ResNet-18 of pytorch/pytorch#139718.

OUT_DTYPE = torch.ops.higher_order.out_dtype


def out_dtype_ops(gm) -> list[str]:
    """The op each ``out_dtype`` node of ``gm`` runs."""
    return [str(n.args[0]) for n in gm.graph.find_nodes(op="call_function", target=OUT_DTYPE)]


class AddReLU(nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)


pair = (torch.randn(2, 8), torch.randn(2, 8))
print(f"SmallNet, per-tensor: {out_dtype_ops(integer)}")
print(f"add + ReLU, per-channel: {out_dtype_ops(reference(AddReLU(), pair, per_channel=True))}")
assert out_dtype_ops(integer) == ["aten.linear.default", "aten.div.Tensor", "aten.mul.Tensor"]
assert not hasattr(OUT_DTYPE, "_schema"), "a higher-order op: no schema to read"

# %%
# **Fix**: lower the q/dq model (``convert_pt2e`` without ``use_reference_representation``):
# XNNPACK's partitioner takes its q/dq groups into delegates, which compute in int8, and the
# program emits and runs as the q/dq model computes. The reference representation is for
# backends that read integer ``aten`` ops, explained in Step 7 of
# :ref:`M07-3 · One graph, every quantizer that runs here
# <sphx_glr_lessons_m07_your_model_m07_3_every_quantizer.py>`.

config = get_symmetric_quantization_config(is_per_channel=False)
prepared = prepare_pt2e(export_module(net, x), XNNPACKQuantizer().set_global(config))
prepared(*x)
per_tensor_qdq = convert_pt2e(prepared)
error = (run(lowered(per_tensor_qdq, x).buffer, x) - per_tensor_qdq(*x)).abs().max().item()
print(f"per-tensor q/dq model on XNNPACK, largest difference from it: {error:.4f}")
assert error < 0.05, "it emits, loads and runs as the q/dq model computes"

# %%
# RuntimeError: Failed to load method forward, error: 0x:1
# --------------------------------------------------------
# The program lowers and saves, then ``load_method`` fails. The runtime's log says more: an
# ``xnn_status_invalid_parameter`` from XNNPACK, and ``Init failed for backend
# XnnpackBackend`` (reported as "XnnpackBackend init failed", executorch#8830). Here a
# linear's output is transposed with ``.t()`` and concatenated with a learned column.


class Transposed(nn.Module):
    def __init__(self, method="t"):
        super().__init__()
        self.method = method
        self.fc = nn.Linear(8, 8)
        self.column = nn.Parameter(torch.randn(8, 1) * 5)

    def forward(self, x):
        y = self.fc(x)
        y = y.t() if self.method == "t" else y.transpose(0, 1)
        return torch.cat([self.column, y], 1)


torch.manual_seed(0)
rows = (torch.randn(4, 8),)
bad = quantized(Transposed("t"), rows)
log = io.StringIO()
with expect_error(RuntimeError, match="Failed to load method forward"):
    run(lowered(bad, rows).buffer, rows, log)
failed = [line for line in log.getvalue().splitlines() if "cpuinfo" not in line]
print("\n".join(failed))
assert any("xnn_status_invalid_parameter" in line for line in failed)

# %%
# **Cause**, on the graph: the ``t`` node (highlighted) reads the linear's int8 output with
# one scale and writes the ``cat``'s input with another. XNNPACK compiles its delegate when
# the method loads, and its static transpose only moves bytes: it refuses an input and an
# output with different qparams. ``XNNPACKQuantizer`` gives one shared scale to the ops that
# move values without changing them (``_is_share_obs_or_fq_op``): ``transpose.int`` and
# ``permute`` are in its list, ``t`` and ``swapaxes`` are not (executorch#19836), so each side
# of ``t`` was observed on its own.

t_node = bad.graph.find_nodes(op="call_function", target=torch.ops.aten.t.default)[0]
scales = (t_node.args[0].args[1], next(iter(t_node.users)).args[1])
draw(bad, highlight=[t_node.name], title="t between two scales")
print(f"scale in {scales[0]:.5f}, scale out {scales[1]:.5f}")
assert scales[0] != scales[1], "the transpose's input and output qparams differ"

# %%
# Which op, in a larger program? ``common.runtime.load_check`` loads a lowered program in a child
# process and reads the runtime's log: XNNPACK names the node it could not build by its debug
# handle, which ``load_check`` finds in the delegate's graph. Here the ``t`` node, which
# ``to_edge`` wrote as ``permute_copy``:

check = load_check(lowered(bad, rows))
print(check)
assert [r.op for r in check.refused] == ["permute_copy.default"], "the transpose"

# %%
# **Fix**: write the transpose as ``.transpose(0, 1)`` (or ``permute``), whose input and output
# the quantizer shares; the program loads and runs. Shared specs are Step 2 of
# :ref:`M06-1 · The XNNPACK quantizer
# <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`.

good = quantized(Transposed("transpose"), rows)
node = good.graph.find_nodes(op="call_function", target=torch.ops.aten.transpose.int)[0]
assert node.args[0].args[1] == next(iter(node.users)).args[1], "one scale on both sides"
assert torch.equal(run(lowered(good, rows).buffer, rows), good(*rows)), "it loads and runs"

# %%
# Segmentation fault when the method runs
# ---------------------------------------
# A script loads a ``.pte`` in one line and runs it; the process dies with no Python
# traceback, of a segmentation fault — most of the time: what the freed memory still holds
# varies, and some runs end as if nothing were wrong. The page runs the script in a child
# process, so that only the child dies, until it does (at most twelve times); the return code
# is minus the signal that killed it, -11 (``SIGSEGV``), on some runs -6 (``SIGABRT``).

pte_path = Path(tempfile.mkdtemp()) / "small.pte"
pte_path.write_bytes(delegate.buffer)
ONE_LINE = f"""
import torch
from executorch.runtime import Runtime
method = Runtime.get().load_program(open({str(pte_path)!r}, "rb").read()).load_method("forward")
method.execute([torch.randn(2, 3, 8, 8)])
print("ran")
"""
codes = []
while len(codes) < 12 and not any(codes):  # until a run dies
    codes.append(subprocess.run([sys.executable, "-c", ONE_LINE], capture_output=True).returncode)
code = codes[-1]
name = signal.Signals(-code).name if code < 0 else "no signal"
print(f"run {len(codes)}: return code {code} ({name})")
assert code != 0, "the process died"  # usually -11 (SIGSEGV): it depends on the freed memory

# %%
# **Cause**: a ``Method`` does not keep its ``Program`` alive. Nothing holds the ``Program``
# that ``load_program(...)`` returned, so Python frees it at the end of the line, and the
# method then reads memory that is gone: undefined behaviour, which may also seem to work.
#
# **Fix**: keep the ``Program`` in a variable for as long as its methods run, as ``run``
# above and :ref:`M06-3 · The .pte, inside out
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>` do.

with contextlib.redirect_stderr(io.StringIO()):
    program = Runtime.get().load_program(pte_path.read_bytes())
    method = program.load_method("forward")
    out = method.execute([x[0]])[0]
assert torch.equal(out, run(delegate.buffer, x)), "the method runs"

# %%
# Conv2d(padding=\'same\') + ReLU fails at run time on XNNPACK
# ------------------------------------------------------------
# Reported on executorch 1.0.0 and 1.3.1 (executorch#20517): a quantized conv with
# ``padding='same'`` and an even kernel, followed by a ReLU, lowers and then fails when the
# program runs. It no longer reproduces on executorch 1.5.1: the reported model runs, as one
# delegate, within one step of the q/dq model.


class Same(nn.Module):
    def __init__(self, kernel=32):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, kernel_size=(kernel, 1), padding="same")

    def forward(self, x):
        return torch.relu(self.conv(torch.reshape(x, (1, 1, 256, 1))))


torch.manual_seed(0)
samples = (torch.randn(1, 256),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
    same = quantized(Same(), samples)
    same_program = lowered(same, samples)
step = [n for n in same.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
steps = ((run(same_program.buffer, samples) - same(*samples)).abs() / step).round().max().item()
print(f"delegates: {list(delegated(same_program.exported_program()))}; {steps:.0f} steps apart")
assert len(delegated(same_program.exported_program())) == 1 and steps <= 1, "it runs"

# %%
# **Cause** (on 1.0–1.3): an even kernel needs more padding on one side than the other, which
# a conv's padding field cannot say, so ``to_edge`` writes an explicit ``constant_pad_nd``
# before the conv. The partitioner did not take that pad with the conv: the conv stayed out of
# the delegate and the ReLU ended in a partition of its own, which XNNPACK rejected
# (``xnn_status_unsupported_parameter``).
#
# **Fix**: executorch 1.5.1 includes executorch#20553, which pulls the pad into the conv's
# partition (``InsertPadQDQPass`` gives it the qparams of its input, a zero pad changes no
# value): the pad is in the delegate. On an older release, an odd kernel (33 here) pads both
# sides alike and needs no pad node. What a partition takes is
# :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.

(inside,) = delegated(same_program.exported_program()).values()
print(inside)
assert any("constant_pad_nd" in name for name in inside), "the pad runs inside the delegate"
odd = to_edge(torch.export.export(Same(kernel=33), samples)).exported_program()
assert not [n for n in odd.graph.nodes if "constant_pad_nd" in str(n.target)], "no pad node"

# %%
# prepare_pt2e fails on a model with a GRU
# ----------------------------------------
# Reported with the ``XNNPACKQuantizer`` and ``prepare_pt2e`` of ``torch.ao`` in April 2025
# (executorch#10104). It no longer reproduces: on this stack ``prepare_pt2e`` and
# ``convert_pt2e`` run. But nothing is quantized.


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(10, 20, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


torch.manual_seed(0)
sequence = (torch.randn(1, 3, 10),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="The tensor attributes self.gru._flat_weights")
    gru = quantized(GRUNet().eval(), sequence)
targets = [str(n.target) for n in gru.graph.nodes if n.op == "call_function"]
print(targets)
assert "aten.gru.input" in targets and not any("quantize" in t for t in targets), "all float"

# %%
# **Cause**: export keeps ``nn.GRU`` whole, one ``aten.gru.input`` node with its weights
# inside, and ``XNNPACKQuantizer`` annotates no such op: the GRU stays float.
#
# **Fix**: to quantize a GRU's matrix products, write its cell with ``nn.Linear`` layers: the
# quantizer annotates linears (and the sigmoid and tanh around them stay float). The same
# rule — the quantizer sees ops, not the module you meant — is in
# :ref:`M05-1 · What the quantizer sees in attention
# <sphx_glr_lessons_m05_transformers_m05_1_attention.py>`.


class LinearGRU(nn.Module):
    def __init__(self, inputs=10, hidden=20):
        super().__init__()
        self.hidden = hidden
        self.x_gates, self.h_gates = nn.Linear(inputs, 3 * hidden), nn.Linear(hidden, 3 * hidden)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden)
        outputs = []
        for t in range(x.shape[1]):
            xr, xz, xn = self.x_gates(x[:, t]).chunk(3, 1)
            hr, hz, hn = self.h_gates(h).chunk(3, 1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            outputs.append(h)
        return torch.stack(outputs, 1)


torch.manual_seed(0)
by_hand = quantized(LinearGRU().eval(), sequence)
linears = by_hand.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
int8 = [n.args[1].target == qd.dequantize_per_channel.default for n in linears]
print(f"{len(linears)} linears, int8 weights: {sum(int8)}")
assert len(linears) == 6 and all(int8), "two linears a step, each with int8 weights"

# %%
# Dynamic quantization without calibration: every weight scale is 1.0
# -------------------------------------------------------------------
# With ``is_dynamic=True`` the activations are measured at run time, so the prepared model
# is converted at once, without running it. ``convert_pt2e`` warns ("must run observer before
# calling calculate_qparams. Returning default values.") and the outputs are off. Here the
# linear is the one dynamically quantized op (a conv followed by a ReLU has no dynamic
# variant, M06-1).


def weight_qparams(gm) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(int8 weight, scales) of each per-channel weight of a converted graph."""
    found = gm.graph.find_nodes(op="call_function", target=qd.dequantize_per_channel.default)
    return [(getattr(gm, n.args[0].target), getattr(gm, n.args[1].target)) for n in found]


with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    uncalibrated = quantized(net, x, calibrate=False, is_dynamic=True)
((int8_weight, scale),) = weight_qparams(uncalibrated)
print(f"weight scale {scale.tolist()}, nonzero int8 weights {int8_weight.count_nonzero()}")
assert torch.equal(scale, torch.ones(1)), "1.0, the observer's default"
assert any("must run observer" in str(w.message) for w in seen), "and convert warned"
far = (uncalibrated(*x) - net(*x)).abs().max().item()

# %%
# **Cause**: dynamic quantization measures the *activations* at run time; the *weights*
# still get their scales from observers, and an observer sees its weight only when the
# prepared model runs. Never run, each returns its default, a scale of 1.0: every weight
# rounds to a whole number, and this layer's, all smaller than 0.5, to 0.

assert int8_weight.count_nonzero() == 0 and net.fc.weight.abs().max() < 0.5, "all rounded to 0"

# %%
# **Fix**: run the prepared model at least once, on real inputs, before ``convert_pt2e``
# (:ref:`M05-2 · Static vs dynamic int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`); each output channel's
# weight scale is then its largest magnitude over 127.

calibrated = quantized(net, x, is_dynamic=True)
((_, scale),) = weight_qparams(calibrated)
near = (calibrated(*x) - net(*x)).abs().max().item()
print(f"largest output error: {far:.4f} uncalibrated, {near:.4f} calibrated")
assert torch.allclose(scale, net.fc.weight.abs().amax(1) / 127), "max |w| / 127 per channel"
assert near < far / 10, "ten times closer to the float model"

# %%
# RuntimeError: method->set_inputs() for method \'forward\' failed with error 0x10
# --------------------------------------------------------------------------------
# A ``.pte`` runs at the batch it was exported with and fails at another. Just before, the
# runtime logs why: ``Attempted to resize a static tensor``, with the expected and received
# shapes (reported as "Attempted to resize a static tensor to a new shape at dimension 0",
# executorch#1350, #9749); for a program exported with a bounded ``Dim``, past its maximum,
# ``Attempted to resize a bounded tensor with a maximum capacity of ... elements``.

log = io.StringIO()
with expect_error(RuntimeError, match="method->set_inputs() for method 'forward' failed"):
    run(delegate.buffer, (torch.randn(3, 3, 8, 8),), log)
resize = [line for line in log.getvalue().splitlines() if "Attempted to resize" in line]
print(resize[0])
assert "static tensor" in resize[0] and "(2, 3, 8, 8)" in resize[0], "planned for batch 2"

# %%
# **Cause**: ``torch.export`` fixes every dimension it is not told is dynamic, and ExecuTorch
# plans each tensor's memory for those shapes ahead of time. The runtime will not grow a
# planned tensor; ``0x10`` is ``InvalidArgument``. A dynamic dimension is planned for its
# upper bound, and past it the same error comes with the "bounded tensor" line.
#
# **Fix**: export with the batch declared dynamic and bounded, ``Dim("batch", min=1,
# max=N)``, on an example batch of at least 2, and pass the same ``dynamic_shapes`` on to the
# ``.pte`` (``common.edge.to_executorch(..., dynamic_shapes=...)``). The model of
# executorch#8539 (a ``Conv1d``, a ReLU, a ``Linear``), reported failing in
# ``to_out_var_pass`` with a dynamic batch on an early 2025 stack, now lowers and runs at
# batch 1 and 8 on the runtime. Explained in :ref:`M06-4 · Shapes that change
# <sphx_glr_lessons_m06_executorch_m06_4_shapes_that_change.py>`.


class Reported(nn.Module):  # executorch#8539's model
    def __init__(self):
        super().__init__()
        self.conv, self.linear = nn.Conv1d(1, 3, 10), nn.Linear(645, 1000)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)).flatten(1))


torch.manual_seed(0)
signals = (torch.randn(2, 1, 224),)
up_to_8 = {"x": {0: Dim("batch", min=1, max=8)}}
config = get_symmetric_quantization_config(is_per_channel=True)
bounded = torch.export.export(Reported().eval(), signals, dynamic_shapes=up_to_8)
prepared = prepare_pt2e(bounded.module(), XNNPACKQuantizer().set_global(config))
for size in (1, 8):
    prepared(torch.randn(size, 1, 224))
reported = convert_pt2e(prepared)
flexible = to_executorch(
    reported, signals, partitioner=XnnpackPartitioner(), dynamic_shapes=up_to_8
)
for size in (1, 8):
    batch = (torch.randn(size, 1, 224),)
    error = (run(flexible.buffer, batch) - reported(*batch)).abs().max().item()
    print(f"batch {size}: largest difference from the q/dq model {error:.4f}")
    assert error < 0.05, "it runs at both ends of the range"

# %%
# The graph changed after to_executorch()
# ---------------------------------------
# Code lowers with ``to_edge_transform_and_lower``, calls ``.to_executorch()``, then reads
# ``edge.exported_program()`` to list what stayed outside the delegates, and finds ops that
# were never in the edge graph: ``.out`` variants and memory-planning ``alloc`` nodes.

lowering = to_edge_transform_and_lower(
    torch.export.export(qdq, x), partitioner=[XnnpackPartitioner()]
)


def portable_ops(program) -> list[str]:
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    return [str(n.target) for n in calls if "delegate" not in str(n.target)]


before = portable_ops(lowering.exported_program())
lowering.to_executorch()
after = portable_ops(lowering.exported_program())
print(f"before: {before}\nafter:  {after}")
assert before != after, "the same program, rewritten"

# %%
# **Cause**: ``to_executorch()`` runs its passes (out variants, memory planning) on the
# ``ExportedProgram`` that ``edge.exported_program()`` returns, in place, and returns a new
# manager; the edge manager keeps pointing at the rewritten graph.
#
# **Fix**: read or copy (``copy.deepcopy``) the edge program before ``to_executorch()``; the
# delegates themselves (``common.edge.delegated``) are the same either way. Lowering and the
# edge graph are :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.

fresh = to_edge_transform_and_lower(torch.export.export(qdq, x), partitioner=[XnnpackPartitioner()])
kept = copy.deepcopy(fresh.exported_program())
fresh.to_executorch()
assert portable_ops(kept) == before, "the copy is the edge graph"

# %%
# Failed to create static slice node: a quantized slice between two scales
# -------------------------------------------------------------------------
# Reported on executorch 1.4.0 (executorch#21829, #21831): a conv's output sliced in two
# halves that are then added lowers, and the method fails to load, the log saying ``Failed to
# create static slice node ... xnn_status_invalid_parameter``. It no longer reproduces on
# executorch 1.5.1: each slice has one scale on both sides, and the program loads.


class Halves(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y[:, :4] + y[:, 4:]


torch.manual_seed(0)
image = (torch.randn(1, 3, 32, 32),)
halves = quantized(Halves().eval(), image)
slices = halves.graph.find_nodes(op="call_function", target=torch.ops.aten.slice.Tensor)
for node in slices:
    scale_in, scale_out = node.args[0].args[1], next(iter(node.users)).args[1]
    print(f"{node.name}: scale in {scale_in:.5f}, out {scale_out:.5f}")
assert all(n.args[0].args[1] == next(iter(n.users)).args[1] for n in slices), "shared"

# %%
# **Cause** (on 1.4): ``XNNPACKQuantizer`` shares a scale across the ops that only move values
# (``_is_share_obs_or_fq_op``), and its list named ``slice_copy``, the op after ``to_edge``,
# but not ``aten.slice.Tensor``, which is what the quantizer sees; each slice was observed on
# its own, and XNNPACK's static slice refuses two scales when the delegate is compiled, at
# load time.
#
# **Fix**: executorch 1.5.1 includes executorch#21568 (``aten.slice.Tensor`` in the list) and
# #21949 (the partitioner leaves a slice with two scales to the portable kernels). To find
# which op a method that will not load refuses, on any release, ``common.runtime.load_check``
# loads it in a child process and names the node (the transpose entry above). Shared specs
# are Step 2 of :ref:`M06-1 · The XNNPACK quantizer
# <sphx_glr_lessons_m06_executorch_m06_1_xnnpack_quantizer.py>`.

assert load_check(lowered(halves, image)).loads, "the program loads"

# %%
# Quantized Conv1d(padding=\'same\') gives wrong outputs on XNNPACK
# -----------------------------------------------------------------
# Reported on executorch 1.3 (executorch#20558), a silent failure: an int8 ``Conv1d`` with an
# even kernel and ``padding='same'`` lowers and runs without an error, with wrong numbers.
# It no longer happens on executorch 1.5.1: the ``.pte`` is within one output step of the
# q/dq model.


class Same1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, kernel_size=4, padding="same")

    def forward(self, x):
        return self.conv(x)


torch.manual_seed(0)
signal = (torch.randn(1, 2, 16),)
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
    same1d = quantized(Same1d().eval(), signal)
    same1d_program = lowered(same1d, signal)
step = [n for n in same1d.graph.nodes if n.target == qd.quantize_per_tensor.default][-1].args[1]
steps = ((run(same1d_program.buffer, signal) - same1d(*signal)).abs() / step).round().max()
print(f"{steps:.0f} output steps from the q/dq model")
assert steps <= 1, "the right numbers"

# %%
# **Cause** (on 1.3): an even kernel pads one side more than the other, which a conv's
# padding field cannot say, so ``to_edge`` writes a ``constant_pad_nd`` before the conv; the
# XNNPACK lowering of that pad and conv lost the asymmetric amounts.
#
# **Fix**: executorch 1.5.1 includes executorch#20734 (and #20553): the pad joins the conv's
# delegate as a quantized static pad with the input's qparams. On an older release, use an
# odd kernel, or pad explicitly with the amounts you mean. Checked here by the pad in the
# delegate; what a partition takes is :ref:`M06-2 · Lowering to ExecuTorch
# <sphx_glr_lessons_m06_executorch_m06_2_lowering_to_executorch.py>`.

(inside,) = delegated(same1d_program.exported_program()).values()
assert any("constant_pad_nd" in name for name in inside), "the pad runs inside the delegate"

# %%
# Unsupported: quantized nyi in meta tensors with fake tensor propagation.
# ------------------------------------------------------------------------
# ``torch._dynamo.exc.Unsupported: Unsupported: quantized nyi ...``, reported in February 2025
# (executorch#8727) for a dynamically quantized model
# (``is_dynamic=True``, per-tensor weights) exported with a dynamic sequence length. That
# error no longer happens here: the pinned stack exports, prepares and converts the reported
# configuration. What is left is a quiet one: XNNPACK does not take the quantized linear. In
# a fresh process ``to_executorch`` stops at the first entry's ``Missing out variants``, naming
# ``choose_qparams``; on this page, where the first entry loaded ``executorch.kernels.quantized``,
# the program runs, its linear as a float ``addmm`` on the portable kernels:


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x)


frames = (torch.randn(1, 20, 16),)
any_length = {"x": {1: Dim("seq_len", min=1, max=1024)}}


def dynamic_int8(per_channel: bool) -> torch.fx.GraphModule:
    """``Encoder`` exported with a dynamic length, quantized dynamically as executorch#8727."""
    settings = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=True)
    program = torch.export.export(Encoder().eval(), frames, dynamic_shapes=any_length)
    prepared = prepare_pt2e(program.module(), XNNPACKQuantizer().set_global(settings))
    prepared(*frames)
    return convert_pt2e(prepared)


per_tensor = dynamic_int8(per_channel=False)
tensor_program = to_executorch(
    per_tensor, frames, partitioner=XnnpackPartitioner(), dynamic_shapes=any_length
)
left_out = operators_run(tensor_program.buffer, list(frames))
print(left_out.summary)
assert not left_out.int8 and "addmm.out" in left_out.portable, (
    "the linear runs in float, outside XNNPACK"
)

# %%
# **Cause**: "quantized nyi" came from quantized tensors (``torch.qint8``, eager-mode
# quantization) reaching the fake tensors of export; a PT2E graph holds plain int8 tensors
# and q/dq ops, which fake tensors support. What is left is XNNPACK's rule: it delegates a
# dynamically quantized linear only with per-channel weights, so with per-tensor weights the
# ``choose_qparams`` and q/dq ops stay outside, on portable kernels that only
# ``executorch.kernels.quantized`` provides, and the linear between them runs in float.
#
# **Fix**: ``is_per_channel=True`` with ``is_dynamic=True``: the linear is delegated, and
# ``operators_run`` shows XNNPACK's dynamically quantized GEMM (``QDU8``: int8 activations
# quantized at run time) at two lengths. Dynamic quantization is
# :ref:`M05-2 · Static vs dynamic int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`.

per_channel = dynamic_int8(per_channel=True)
encoder_program = to_executorch(
    per_channel, frames, partitioner=XnnpackPartitioner(), dynamic_shapes=any_length
)
for length in (5, 20):
    operators = operators_run(encoder_program.buffer, [torch.randn(1, length, 16)])
    print(f"length {length}: {operators.summary.splitlines()[0]}")
    assert operators.int8 and not operators.portable, "the linear runs in XNNPACK, int8"

# %%
# Dynamic quantization: the .pte loads on the host, fails to load on the device
# -----------------------------------------------------------------------------
# Reported for a transformer quantized with ``is_dynamic=True`` (executorch#11355, open): the
# ``.pte`` lowers, and ``load_method`` fails in the Android app. This page cannot run an
# Android build. On this runtime the same kind of program loads and runs: an
# ``nn.TransformerEncoderLayer`` with dynamically quantized linears.

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
tokens_in = (torch.randn(1, 10, 32),)
dynamic_layer = quantized(layer, tokens_in, is_dynamic=True)
layer_program = lowered(dynamic_layer, tokens_in)
check = load_check(layer_program)
print(f"load_check: {check}")
assert check.loads, "it loads on this runtime"

# %%
# **Cause**: not reproduced on this page. XNNPACK compiles a delegate when the method loads,
# in the runtime that loads it: what the host shows is that this release's runtime accepts
# the program, here with ``QDU8`` GEMMs (int8 activations quantized at run time, the first
# line below). A device runtime built from another ExecuTorch release, or with an XNNPACK
# without those kernels, is another runtime.
#
# **Fix**: build the device runtime from the same ExecuTorch release as the package that
# wrote the ``.pte``, with XNNPACK; check the program on the host with ``load_check`` and
# ``operators_run`` (``common.runtime``), and compare the device's log with the operators listed
# here. Dynamic quantization is :ref:`M05-2 · Static vs dynamic int8
# <sphx_glr_lessons_m05_transformers_m05_2_static_vs_dynamic.py>`.

layer_operators = operators_run(layer_program.buffer, list(tokens_in))
print(layer_operators.summary)
assert any("QD" in op for op in layer_operators.int8), "dynamically quantized GEMMs"

# %%
# RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
# ----------------------------------------------------------------------------------------
# A decoder with a KV cache (M08's, one block and untrained: the graph fails, not the values),
# exported the usual way, ``torch.export.export`` with grad mode on (the default), lowers to
# XNNPACK; then ``to_executorch()`` fails. The message's next line names the node: a
# ``copy_`` into the cache buffer ``b_layers_0_attention_k_cache``.

from common.language_model import MAX_LEN, Decoder, encode, export_decoder, reset_cache

torch.manual_seed(0)
one_block = Decoder(layers=1).eval()
tokens = encode("import ")
prefill = (tokens[None], torch.arange(len(tokens)))
length = Dim("length", min=1, max=MAX_LEN)
grad_on = torch.export.export(one_block, prefill, dynamic_shapes=({1: length}, {0: length}))
edge = to_edge_transform_and_lower(grad_on, partitioner=[XnnpackPartitioner()])
with expect_error(RuntimeError, match="a leaf Variable that requires grad") as caught:
    edge.to_executorch()
node = next(line for line in str(caught.error).splitlines() if "While executing" in line)
written_from = re.search(r"args = \((.*?)\)", node)[1]
print(f"{node.split(' :')[0]}: copy_({written_from})")
assert "copy_" in node and "k_cache" in node, "a copy_ into the cache"

# %%
# **Cause**: exported with grad on, the program's cache inputs are tensors that require grad
# (their traced values, printed below), because the cache is written from keys and values
# computed from the parameters. ``to_executorch()`` writes each updated buffer back with a
# ``copy_`` and runs the graph again in its passes, in the caller's grad mode; autograd
# refuses an in-place write into a leaf tensor that requires grad.


def cache_inputs(program) -> dict[str, bool]:
    """requires_grad of the traced value of each cache input of an exported program."""
    return {
        n.name: n.meta["val"].requires_grad
        for n in program.graph.find_nodes(op="placeholder")
        if "cache" in n.name
    }


print(f"exported with grad on: {cache_inputs(grad_on)}")
assert all(cache_inputs(grad_on).values()), "the caches require grad"

# %%
# **Fix**: export and lower under ``torch.no_grad()``, as ``common.language_model.export_decoder``
# exports (either is enough here: the same lowered program goes through ``to_executorch()``
# under ``torch.no_grad()``). The program then runs on the ExecuTorch runtime and computes the
# eager model's logits, for the prompt and for the next token, which reads the cache the
# prompt wrote. The decoder's way to a ``.pte`` is
# :ref:`M08-3 · To a phone <sphx_glr_lessons_m08_language_model_m08_3_to_a_phone.py>`.

print(f"exported under no_grad: {cache_inputs(export_decoder(one_block))}")
with torch.no_grad(), warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", "Mutation on a buffer"
    )  # a cache's initial value does not matter: the mask hides it
    pte = edge.to_executorch()
decode = (torch.tensor([[3]]), torch.tensor([len(tokens)]))
with contextlib.redirect_stderr(io.StringIO()):
    cached_program = Runtime.get().load_program(pte.buffer)  # alive while its method runs
    method = cached_program.load_method("forward")
    on_runtime = [method.execute(list(call))[0] for call in (prefill, decode)]
reset_cache(one_block)
with torch.no_grad():
    eager = [one_block(*call) for call in (prefill, decode)]
assert not any(cache_inputs(export_decoder(one_block)).values()), "no grad, no leaf to refuse"
for ours, theirs in zip(on_runtime, eager, strict=True):
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

# %%
# Next
# ----
# Back to :ref:`M06-3 · The .pte, inside out
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`, or to the
# :ref:`first troubleshooting page <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`.

"""
Troubleshooting: ExecuTorch and XNNPACK
=======================================

After ``convert_pt2e``, on the way to a ``.pte`` and on the ExecuTorch runtime: a program that
will not emit, a delegate that will not load, a process that dies without a Python error,
and a dynamic model whose weights were never measured. Each entry is headed by the exact
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

from common.edge import delegated

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
# raw int8 weights plus the bias: the delegate drops the weights' scales. Check the values before you ship such a program.

weight = weight_only[0].weight  # torchao's tensor subclass: int8 ``qdata``, one scale a row
out = run(lowered(weight_only, tokens).buffer, tokens)
error = (out - weight_only(*tokens)).abs().max().item()
print(f"quantize_ on XNNPACK, largest difference from the quantize_ model: {error:.1f}")
unscaled = tokens[0] @ weight.qdata.float().T + weight_only[0].bias
assert error > 1 and torch.allclose(out, unscaled, atol=1e-3), "the int8 values, unscaled"

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
# Next
# ----
# Back to :ref:`M06-3 · The .pte, inside out
# <sphx_glr_lessons_m06_executorch_m06_3_pte_inside_out.py>`, or to the
# :ref:`first troubleshooting page <sphx_glr_lessons_troubleshooting_m99_1_imports_and_export.py>`.

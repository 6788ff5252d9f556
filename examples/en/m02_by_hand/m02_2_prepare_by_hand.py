"""
M02-2 prepare by hand
=====================

``prepare_pt2e`` does three things: it folds BatchNorm into the conv before it, lets the
quantizer annotate, and inserts an observer wherever an annotation asks for one, sharing one
observer between places that must use the same scale and zero point. This lesson does all of
it by hand on ``small_cnn`` with the course quantizer, using the insertion moves of M00-4, and
ends with the same graph as ``prepare_pt2e``, character for character, and after the same
calibration the same scale and zero point in every observer.

**What you will learn**

- How BatchNorm disappears into the conv's weight and bias
- Which edges and outputs get an observer, and when two of them share one
- How an observer is inserted on an edge, and how an existing one is reused

**Prerequisites**: M00-4 (steps 1–3), M02-1.
"""

# %%
# Setup
# -----
# ``reference`` is torchao's result on the same model; everything we build is compared with it.

import torch
from torch.nn.utils.fusion import fuse_conv_bn_weights

from common.models import example_inputs, get_model
from common.pt2e import calibrate, export_module, quiet
from common.viz import draw

quiet()

from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e  # noqa: E402

from common import handmade  # noqa: E402
from common.quantizer import CourseQuantizer  # noqa: E402


def place(key):
    """An edge (a, b) as 'a → b', an output node as its name."""
    return f"{key[0].name} → {key[1].name}" if isinstance(key, tuple) else key.name


x = example_inputs(8)
model = get_model("small_cnn")
reference = prepare_pt2e(export_module(model, x), CourseQuantizer())
gm = export_module(model, x)
draw(gm, highlight=["batch_norm"], title="Before: the exported graph")

# %%
# Step 1 — Fold BatchNorm into the conv
# -------------------------------------
# In eval mode BatchNorm computes ``(y - mean) / sqrt(var + eps) * gamma + beta`` per
# channel: an affine map, which can be baked into the conv's weight and bias.
# ``torch.nn.utils.fusion.fuse_conv_bn_weights`` computes the new pair; the fold then rewires
# the batch norm's users to the conv (M00-4 step 2) and removes it (step 6).

bn = model.bn
expected_w, expected_b = fuse_conv_bn_weights(
    model.conv.weight, model.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
)
handmade.fold_batch_norm(gm)
print("nodes now:", [n.name for n in gm.graph.nodes if n.op == "call_function"])
assert torch.equal(gm.conv.weight, expected_w) and torch.equal(gm.conv.bias, expected_b)
assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.batch_norm.default)
with torch.no_grad():
    torch.testing.assert_close(gm(*x), model(*x), rtol=0, atol=1e-5)  # only rounding changes
draw(gm, highlight=["conv2d"], title="Step 1: batch_norm folded into conv2d")

# %%
# Step 2 — Collect the places to observe
# --------------------------------------
# After ``annotate``, every input edge in an ``input_qspec_map`` (an observed edge) and every
# non-``None`` ``output_qspec`` is a place that needs an observer.
# ``handmade.collect_qspecs`` lists them in graph order.

quantizer = CourseQuantizer()
quantizer.annotate(gm)
qspecs = handmade.collect_qspecs(gm)
for key, qspec in qspecs.items():
    print(f"{place(key):22} {type(qspec).__name__}")
assert len(qspecs) == 10, "conv: 2 edges, relu: 1 output, pool and flatten: 2 each, linear: 2 + 1"

# %%
# Step 3 — Decide which places share an observer
# ----------------------------------------------
# Places in one *sharing group* get one observer, hence one scale and zero point. Two rules
# build the groups (a union-find, ``handmade.sharing_groups``). Explicit: a
# ``SharedQuantizationSpec`` joins its place to the one it points to. Implicit: the edge
# ``relu → max_pool2d`` carries the very tensor ``relu`` outputs, so with equal specs the two
# places join. Here six places end up in one group: relu's output through the linear's input.

groups = handmade.sharing_groups(qspecs)
members = {}
for key, root in groups.items():
    members.setdefault(place(root), []).append(place(key))
for root, keys in members.items():
    print(f"group of {root}: {keys}")
big = members["relu"]
assert big == [
    "relu",
    "relu → max_pool2d",
    "max_pool2d",
    "max_pool2d → flatten",
    "flatten",
    "flatten → linear",
]
assert len(members) == 5, "10 places, 5 observers"

# %%
# Step 4 — Create one observer per group
# --------------------------------------
# Each group's observer is built from its first member's spec: ``MinMaxObserver`` for the
# activations, ``PerChannelMinMaxObserver`` for the two weights. Every member maps to the same
# Python object.

observers = handmade.create_observers(qspecs, groups)
nodes = {node.name: node for node in gm.graph.nodes}
relu, pool = nodes["relu"], nodes["max_pool2d"]
print({place(k): type(v).__name__ for k, v in observers.items() if place(k).startswith("conv")})
assert observers[relu] is observers[(relu, pool)] is observers[pool], "one object, one group"
assert len({id(o) for o in observers.values()}) == 5

# %%
# Step 5 — Insert input observers by hand
# ---------------------------------------
# The conv's two input edges each get a new observer: register it (``add_submodule``), call it
# right after the producer (``inserting_after`` + ``call_module``), and make the conv read it.
# torchao names observers ``activation_post_process_N`` in the order it inserts them.

graph, conv, conv_weight = gm.graph, nodes["conv2d"], nodes["conv_weight"]
for number, source in enumerate([nodes["x"], conv_weight]):
    name = f"activation_post_process_{number}"
    gm.add_submodule(name, observers[(source, conv)])
    with graph.inserting_after(source):
        observer_node = graph.call_module(name, (source,))
    conv.replace_input_with(source, observer_node)
print(conv.format_node())
assert [a.name for a in conv.args[:2]] == ["activation_post_process_0", "activation_post_process_1"]

# %%
# Step 6 — Insert an output observer by hand
# ------------------------------------------
# An output observer sits right after its node, and *every* user of the node reads it instead:
# M00-4's ``replace_all_uses_with`` with ``delete_user_cb``, so that the observer does not end
# up reading itself.

gm.add_submodule("activation_post_process_2", observers[relu])
with graph.inserting_after(relu):
    relu_observer = graph.call_module("activation_post_process_2", (relu,))
relu.replace_all_uses_with(relu_observer, delete_user_cb=lambda user: user is not relu_observer)
assert pool.args[0] is relu_observer and relu_observer.args == (relu,)
gm.recompile()
draw(gm, highlight=[f"activation_post_process_{i}" for i in range(3)], title="Steps 5–6")

# %%
# Step 7 — Reuse, and the rest with handmade
# ------------------------------------------
# The pool's input edge belongs to relu's group, and relu's observer already sits on it: no new
# node. The pool's output is in the same group, so it gets a *second call* of the *same*
# observer object under a new name. ``handmade.observe_node`` does exactly these cases for one
# node; we run it for the pool, flatten and linear.

for name in ["max_pool2d", "flatten", "linear"]:
    handmade.observe_node(gm, nodes[name], observers)
gm.recompile()
for line in gm.code.splitlines():
    if "= self.activation_post_process" in line:
        print(line.split(";")[0].strip())
assert pool.args[0] is relu_observer, "the existing observer was reused, none inserted"
assert gm.activation_post_process_3 is gm.activation_post_process_2, "a shared observer"

# %%
# Step 8 — Compare with prepare_pt2e
# ----------------------------------
# The code of our graph is the code of torchao's, line for line. After the same calibration,
# every observer holds the same scale and zero point, bit for bit.

inserted = [n.name for n in gm.graph.nodes if handmade.is_observer_node(gm, n)]
draw(gm, highlight=inserted, title="After: prepare by hand")
assert gm.code == reference.code, "the same graph as prepare_pt2e"
calibrate(gm)
calibrate(reference)
for name in inserted:
    ours, theirs = gm.get_submodule(name), reference.get_submodule(name)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert torch.equal(a, b), f"{name}: different qparams"
print(f"{len(inserted)} observer calls, identical graph and qparams")

# %%
# ``common.handmade.prepare`` packages these steps (plus bookkeeping so that torchao's
# ``convert_pt2e`` accepts its result). It, too, gives torchao's graph:

packaged = handmade.prepare(export_module(model, x), CourseQuantizer())
assert packaged.code == reference.code, "handmade.prepare == prepare_pt2e"

# %%
# Summary
# -------
# prepare = fold BatchNorm, annotate, group the annotated places (explicit and implicit
# sharing), one observer per group, insert: a new ``call_module`` after the producer, or reuse of
# the one already there. Next, :ref:`sphx_glr_lessons_m02_by_hand_m02_3_convert_by_hand.py`
# turns the calibrated observers into quantize/dequantize nodes.

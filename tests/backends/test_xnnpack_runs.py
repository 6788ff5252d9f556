"""common.backends.xnnpack.runs: where XNNPACK's partitioner put an atlas entry's op."""

import pytest

from common import atlas
from common.backends.xnnpack import runs
from common.pt2e import quiet

quiet()

# XNNPACKQuantizer exports its conv-bn patterns at every prepare (~2 s): once per worker
pytestmark = pytest.mark.usefixtures("torchao_patterns_exported_once")  # tests/conftest.py


def test_a_4d_mean_over_h_and_w_with_keepdim_is_delegated():
    """XNNPACK's global average pool takes it (M07-4, Step 4)."""
    item = atlas.entry("mean · keepdim")
    ran = runs.xnnpack_runs(item, atlas.quantize(item, "xnnpack"))
    assert ran["delegated"], ran
    assert ran["inside"] and not ran["portable"], ran


def test_an_rmsnorm_as_llama_writes_it_runs_in_xnnpack_but_for_its_mean():
    """PowConfig takes ``pow(x, 2)``, ReciprocalSquareRootConfig ``rsqrt`` (float kernels);
    MeanDimConfig refuses a mean over the last axis of a 3-D tensor."""
    item = atlas.entry("rms_norm · as Llama writes it")
    ran = runs.xnnpack_runs(item, atlas.quantize(item, "xnnpack"))
    inside = {name.rsplit("_", 1)[0] if name[-1].isdigit() else name for name in ran["inside"]}
    assert {"aten_pow_tensor_scalar", "aten_rsqrt_default"} <= inside, ran
    assert ran["portable"] == ["mean"], ran
    assert ran["why"].startswith("mean.dim only supports averaging 4D tensors"), ran


def test_a_kv_cache_write_runs_on_the_portable_kernels():
    """``index_copy_`` becomes ``index_put`` on the edge graph; XNNPACK has no config for it."""
    item = atlas.entry("index_copy_ · KV cache")
    ran = runs.xnnpack_runs(item, atlas.quantize(item, "xnnpack"))
    assert not ran["delegated"] and ran["portable"] == ["index_put"], ran
    assert ran["why"] == "", "no config: nothing logged"

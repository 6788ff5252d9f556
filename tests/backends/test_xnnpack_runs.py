"""common.backends.xnnpack.runs: where XNNPACK's partitioner put an atlas entry's op."""

from common import atlas
from common.backends.xnnpack import runs
from common.pt2e import quiet

quiet()


def test_a_4d_mean_over_h_and_w_with_keepdim_is_delegated():
    """XNNPACK's global average pool takes it (M07-4, Step 4)."""
    item = atlas.entry("mean · keepdim")
    ran = runs.xnnpack_runs(item, atlas.quantize(item, "xnnpack"))
    assert ran["delegated"], ran
    assert ran["inside"] and not ran["portable"], ran

"""Stage placement on a Ray cluster of two nodes (ray.cluster_utils: two raylets on this machine,
one CPU each): the SPREAD placement group puts the two stages on different nodes, and the result
is still the single engine's. About 15 s, most of it starting the two nodes."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ds4[distributed]')")

import ds4  # noqa: E402
from ds4.distributed import PipelineEngine  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_stages_land_on_different_nodes(two_nodes, tiny_path) -> None:
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    # Half a CPU each: both stages would fit on one node, so only the spreading separates them.
    with PipelineEngine(tiny_path, stages=2, threads=1, cpus_per_stage=0.5) as eng:
        assert eng.stage_info[0]["node"] != eng.stage_info[1]["node"]
        toks = np.random.default_rng(0).integers(0, 512, 70).tolist()
        s = eng.session(ctx=128)
        s.sync(toks)
        ref = ds4.Engine(tiny_path, threads=1).session(ctx=128)
        ref.sync(toks)
        assert np.array_equal(s.logits, ref.logits) and s.save_payload() == ref.save_payload()

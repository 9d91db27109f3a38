"""The sparse old distribution survives verl's TransferQueue (the store between the old-log-prob pass
and the update pass in verl 0.9.1's v1 trainer).

In a separate process (Ray state stays out of the test session): a local Ray instance and
TransferQueue, a ``kv_batch_put`` of the jagged [B, response_len, K+1] int32 / fp32 fields the
engine hook returns, next to a field put earlier under the same keys; ``kv_batch_get`` returns them
bit-identical, for all keys and for a reordered subset, and the put's ``KVBatchMeta.fields`` lists
every stored field (so the update pass, which reads the batch by those fields, receives them).

Run: ``pytest tests/verl/test_plugins_transfer_queue.py`` (starts Ray: ~20 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]
pytest.importorskip("transfer_queue")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = """
import json
import ray, torch
from tensordict import TensorDict
from runners.backends.verl.plugins.sparse_old import nested_by_lengths, OLD_TOPK_INDEX, OLD_TOPK_LOGP
ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
import transfer_queue as tq
try:
    tq.init()
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 1, 4])
    index = torch.randint(0, 151936, (8, 65), generator=gen, dtype=torch.int32)
    logp = torch.randn(8, 65, generator=gen)
    logp[:, 5:64] = float("-inf")
    keys = ["u0_0_0", "u0_0_1", "u1_0_0"]
    mask = torch.nested.as_nested_tensor([torch.ones(int(n), dtype=torch.int64) for n in lengths], layout=torch.jagged)
    tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"response_mask": mask}, batch_size=3))
    fields = TensorDict({OLD_TOPK_INDEX: nested_by_lengths(index, lengths), OLD_TOPK_LOGP: nested_by_lengths(logp, lengths)}, batch_size=3)
    meta = tq.kv_batch_put(keys=keys, partition_id="train", fields=fields)
    back = tq.kv_batch_get(keys=keys, partition_id="train")
    sub = tq.kv_batch_get(keys=["u1_0_0", "u0_0_0"], partition_id="train", select_fields=[OLD_TOPK_INDEX])
    parts = torch.split(index, lengths.tolist())
    print(json.dumps({
        "fields": sorted(meta.fields),
        "index": all(torch.equal(a, b) for a, b in zip(back[OLD_TOPK_INDEX].unbind(), parts)),
        "logp": all(torch.equal(a, b) for a, b in zip(back[OLD_TOPK_LOGP].unbind(), torch.split(logp, lengths.tolist()))),
        "dtypes": [str(back[OLD_TOPK_INDEX].dtype), str(back[OLD_TOPK_LOGP].dtype)],
        "subset": [torch.equal(sub[OLD_TOPK_INDEX].unbind()[0], parts[2]), torch.equal(sub[OLD_TOPK_INDEX].unbind()[1], parts[0])],
    }))
finally:
    tq.close()
    ray.shutdown()
"""


def test_sparse_fields_round_trip_through_transfer_queue():
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=REPO,
        # its own Ray: never join a cluster another test left in the environment (RAY_ADDRESS)
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["fields"] == ["old_topk_index", "old_topk_logp", "response_mask"]
    assert out["index"] and out["logp"] and out["subset"] == [True, True]
    assert out["dtypes"] == ["torch.int32", "torch.float32"]

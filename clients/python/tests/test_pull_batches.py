"""A pull's tensors go in pull_tensors requests under the daemon's request bound (1 MiB), each
with only the handles it uses, re-indexed (weightd_client.pull.batches): a model of 100k tensors
needs several."""

import base64
import json

from weightd_client.protocol import MAX_REQUEST_BYTES
from weightd_client.pull import batches


def test_every_tensor_goes_once_under_the_bound_with_its_own_handle():
    handles = [base64.b64encode(i.to_bytes(2, "big") * 32).decode() for i in range(300)]
    entries = [{"name": f"model.layers.{i // 7}.mlp.experts.{i % 7}.down_proj.weight", "source": i % 300, "offset": i * 4096, "bytes": 4096} for i in range(100_000)]
    sent = list(batches(entries, handles))
    assert len(sent) > 1, "100k tensors do not fit one request"
    seen = []
    for sources, batch in sent:
        body = json.dumps({"id": 1, "cmd": "pull_tensors", "update": "u" * 32, "sources": sources, "tensors": batch})
        assert len(body) < MAX_REQUEST_BYTES
        assert len(set(sources)) == len(sources) and {e["source"] for e in batch} == set(range(len(sources))), "only the handles the batch uses, each once"
        seen += [{**e, "source": handles.index(sources[e["source"]])} for e in batch]
    assert seen == entries

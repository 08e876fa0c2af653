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


def test_a_pull_that_fits_one_request_goes_as_it_is_and_its_size_bound_holds():
    handles = [base64.b64encode(bytes([i]) * 64).decode() for i in range(3)]
    entries = [{"name": f"model.layers.{i // 9}.w{i % 9}.weight", "source": i % 3, "offset": i * 4096, "bytes": 4096} for i in range(291)]
    assert list(batches(entries, handles)) == [(handles, entries)], "every handle used: the entries go unchanged, in one request"
    # Only handles 0 and 2 used: those two go, and the entries index them.
    some = [e for e in entries if e["source"] != 1]
    [(sources, batch)] = list(batches(some, handles))
    assert sources == [handles[0], handles[2]] and [sources[e["source"]] for e in batch] == [handles[e["source"]] for e in some]
    assert [{k: v for k, v in e.items() if k != "source"} for e in batch] == [{k: v for k, v in e.items() if k != "source"} for e in some]
    assert list(batches([], handles)) == [], "nothing to pull: no request"
    # The bound the fast path trusts is at least what the JSON takes, whatever the name.
    from weightd_client.pull import _size_bound

    for name in ["w", "é" * 300, "\U0001F600" * 200, '"\\' * 100, "\x00\x1f" * 100]:
        e = {"name": name, "source": 4294967295, "offset": 2**53 - 1, "bytes": 2**53 - 1}
        assert len(json.dumps(e)) + 16 <= _size_bound([e]), name[:8]

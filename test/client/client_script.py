"""Python twin of clientScript.ts for the end-to-end tests:
python client_script.py <command> <socket> <expected-json> [arg]
  hashes map|copy   attach (or copy), print {tensors: {name: {sha256, shape, ctor}}}, detach; with the
                    segment mappings and descriptors held while attached and after
  hold              attach zero-copy, print {leaseId, pid}, keep the mapping until killed
  load_state_dict   (torch) attach, load into a module built on the meta device with assign=True,
                    print {params, zeroCopy}: whether every parameter is the daemon's memory
  loop <ms>         attach/verify/detach in a loop for <ms>, print {iterations, mapsBefore, mapsAfter,
                    openFdsAfterFirst, openFdsAfter}
One JSON line on stdout; errors on stderr with exit code 1.
"""

import hashlib
import json
import os
import sys
import time

from weightd_client import WeightdClient

FORMAT = os.environ.get("WEIGHTD_TEST_TENSOR_FORMAT", "auto")
DEVICE = int(os.environ["WEIGHTD_TEST_CUDA_DEVICE"]) if "WEIGHTD_TEST_CUDA_DEVICE" in os.environ else None


def segment_maps() -> int:
    """Lines of this process's memory map that are weightd segments (memfds, "/memfd:weightd:...")."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sum(1 for line in f if "/memfd:weightd:" in line)


def open_fds() -> list:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the listing's own descriptor
    return out


def segment_fds() -> int:
    """Segment descriptors this process holds: the client closes each right after mapping it."""
    return sum(1 for t in open_fds() if t.startswith("/memfd:weightd:"))


def device_bytes(t, mapping) -> bytes:
    """The bytes behind a __cuda_array_interface__, read through its pointer as a consumer would
    (in the mapping's context: the client leaves none of its own current)."""
    import ctypes

    cai = t.__cuda_array_interface__
    out = ctypes.create_string_buffer(t.nbytes)
    d = mapping.driver
    if t.nbytes:
        with mapping._current():
            d.check(d.cuMemcpyDtoH(out, cai["data"][0], t.nbytes), "cuMemcpyDtoH")
    return out.raw[: t.nbytes]


def describe(t, mapping=None):
    if type(t).__module__.startswith("torch"):
        import torch

        data = t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
        return {"sha256": hashlib.sha256(data).hexdigest(), "shape": list(t.shape), "ctor": str(t.dtype), "device": str(t.device)}
    if hasattr(t, "__cuda_array_interface__"):
        return {"sha256": hashlib.sha256(device_bytes(t, mapping)).hexdigest(), "shape": list(t.shape), "ctor": f"cuda:{t.__cuda_array_interface__['typestr']}"}
    data = t.tobytes() if hasattr(t, "tobytes") else bytes(t)
    kind = str(t.dtype) if hasattr(t, "dtype") else f"memoryview:{t.format}"
    return {"sha256": hashlib.sha256(data).hexdigest(), "shape": list(t.shape), "ctor": kind}


def main() -> int:
    command, socket_path, expected_json = sys.argv[1:4]
    arg = sys.argv[4] if len(sys.argv) > 4 else None
    expected = json.loads(expected_json)
    fp, fields = expected["fingerprint"], expected.get("fingerprintFields")
    client = WeightdClient(socket_path)
    if command == "hashes":
        if arg == "copy":
            result = client.copy(fp, fields, device=DEVICE, tensor_format=FORMAT)
            if getattr(result, "status", None) == "mismatch":
                print(json.dumps({"mismatch": result.fields}))
                return 0
            out = {name: describe(t) for name, t in result.items()}
            maps, fds = segment_maps(), segment_fds()
        else:
            result = client.attach(fp, fields, device=DEVICE, tensor_format=FORMAT)
            if result.status == "mismatch":
                print(json.dumps({"mismatch": result.fields}))
                return 0
            out = {name: describe(t, result._mapping) for name, t in result.tensors.items()}
            maps, fds = segment_maps(), segment_fds()
            result.detach()
        print(json.dumps({"tensors": out, "mapsWhileAttached": maps, "mapsAfter": segment_maps(), "fdsWhileAttached": fds, "fdsAfter": segment_fds()}))
    elif command == "hold":
        result = client.attach(fp, fields, tensor_format=FORMAT)
        print(json.dumps({"leaseId": result.lease_id, "pid": os.getpid()}), flush=True)
        client.close()
        while True:
            time.sleep(3600)
    elif command == "load_state_dict":
        import torch

        result = client.attach(fp, fields, device=DEVICE, tensor_format="torch")
        root = torch.nn.Module()
        with torch.device("meta"):
            for t in result.state["tensors"]:
                *path, leaf = t["name"].split(".")
                mod = root
                for part in path:
                    if not hasattr(mod, part):
                        mod.add_module(part, torch.nn.Module())
                    mod = getattr(mod, part)
                mod.register_parameter(leaf, torch.nn.Parameter(torch.empty(t["shape"], dtype=result.tensors[t["name"]].dtype), requires_grad=False))
        root.load_state_dict(result.tensors, assign=True, strict=True)
        same = all(root.get_parameter(n).data_ptr() == result.tensors[n].data_ptr() for n in result.tensors)
        print(json.dumps({"params": len(list(root.parameters())), "zeroCopy": same, "device": str(next(root.parameters()).device)}))
        del root
        result.detach()
    elif command == "loop":
        until = time.monotonic() + int(arg) / 1000
        maps_before = segment_maps()
        iterations, reference, open_after_first = 0, None, 0
        while time.monotonic() < until:
            result = client.attach(fp, fields, tensor_format=FORMAT)
            # Hash one tensor each time: the bytes must never change under a live lease.
            first = next(iter(result.tensors.values()))
            digest = describe(first, result._mapping)["sha256"]
            del first
            if reference is not None and digest != reference:
                raise SystemExit(f"tensor bytes changed between attaches: {reference} -> {digest}")
            reference = digest
            result.detach()
            iterations += 1
            if iterations == 1:
                open_after_first = len(open_fds())
        print(json.dumps({"iterations": iterations, "mapsBefore": maps_before, "mapsAfter": segment_maps(), "openFdsAfterFirst": open_after_first, "openFdsAfter": len(open_fds())}))
    else:
        raise SystemExit(f"unknown command {command}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

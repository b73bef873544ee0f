#!/usr/bin/env python3
"""EPL's safetensors files against PyTorch, both ways.

Debian 12 ships no python3-safetensors, so the Python side reads and writes the format
itself, from its specification (https://github.com/huggingface/safetensors, "Format"):
an 8-byte little-endian header length, a JSON header, then the tensors' bytes.

Usage: torch_interop.py EPL_SAFETENSORS_TOOL
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    sys.exit("error: no torch for this python: tools/setup.sh installs python3-torch")

DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}
# Same-width integer views, so torch hands the raw bytes to numpy (which lacks bfloat16).
RAW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
       torch.int32: torch.int32, torch.int64: torch.int64, torch.uint8: torch.uint8}


def read_spec(path):
    """Reads a safetensors file per the spec, checking the layout rules as it goes."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header past the end"
    raw_header = data[8:8 + n]
    assert raw_header[:1] == b"{", "header must start with {"
    assert (8 + n) % 8 == 0, f"data should start 8-aligned, starts at {8 + n}"
    assert raw_header.rstrip(b" ") == raw_header.rstrip(), "padding must be spaces"
    header = json.loads(raw_header.decode("utf-8"))
    buffer = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name)
                   for name, info in header.items())
    at = 0
    for begin, end, name in spans:
        assert begin == at, f"{name}: data not contiguous ({begin} != {at})"
        at = end
    assert at == len(buffer), "trailing bytes or a short buffer"
    tensors = {}
    for name, info in header.items():
        assert set(info) == {"dtype", "shape", "data_offsets"}, info
        dtype = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if begin == end:
            t = torch.empty(info["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(buffer[begin:end]), dtype=dtype).reshape(info["shape"])
        assert t.numel() * t.element_size() == end - begin, name
        tensors[name] = t
    return tensors, metadata


def write_spec(path, tensors, metadata, pad=True, reverse_data=False):
    """Writes a safetensors file per the spec; data in reverse key order when asked."""
    order = list(tensors)[::-1] if reverse_data else list(tensors)
    header, blobs, offset = {}, [], 0
    for name in order:
        t = tensors[name].contiguous()
        blob = t.view(RAW[t.dtype]).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header = {"__metadata__": metadata, **{k: header[k] for k in tensors}}
    text = json.dumps(header).encode("utf-8")
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def same(a, b):
    """Equal dtype, shape and values; for floats also the sign of zeros."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        return False
    return not a.is_floating_point() or torch.equal(torch.signbit(a), torch.signbit(b))


def check_ours_in_torch(tool, folder):
    path = os.path.join(folder, "ours.safetensors")
    subprocess.run([tool, "write", path], check=True)
    tensors, metadata = read_spec(path)
    expected = {
        "weight": torch.tensor([[-1.5, 0.25, 2.0 ** 100], [-0.0, 2.0 ** -149, 7.0]]),
        "step": torch.tensor(123456789012, dtype=torch.int64),
        "ids": torch.tensor([-1, 0, 7, 2147483647], dtype=torch.int32),
        "half": torch.tensor([1.0, -2.5, 65504.0], dtype=torch.float16),
        "brain": torch.tensor([[1.0, -2.0], [0.5, 3.140625]], dtype=torch.bfloat16),
        "raw": torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 4),
    }
    assert set(tensors) == set(expected), sorted(tensors)
    for name, want in expected.items():
        assert same(tensors[name], want), f"{name}: {tensors[name]} != {want}"
    assert metadata == {"format": "pt", "step": "42", "note": "ünïcode"}, metadata
    print(f"torch read EPL's file: {len(tensors)} tensors and metadata match")


def check_torch_in_ours(tool, folder):
    torch.manual_seed(0)
    tensors = {
        "w": torch.randn(3, 4),
        "idx": torch.arange(-5, 5, dtype=torch.int64),
        "i32": torch.tensor([[1, -2], [3, 2 ** 31 - 1]], dtype=torch.int32),
        "h": torch.randn(5).half(),
        "bf": torch.randn(2, 3).bfloat16(),
        "u8": torch.randint(0, 256, (7,), dtype=torch.uint8),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    metadata = {"format": "pt", "epoch": "3"}
    for pad, reverse in [(True, False), (False, True)]:
        path = os.path.join(folder, f"torch-{pad}-{reverse}.safetensors")
        write_spec(path, tensors, metadata, pad=pad, reverse_data=reverse)
        out = subprocess.run([tool, "dump", path], check=True, capture_output=True, text=True)
        dumped = json.loads(out.stdout)
        assert dumped["metadata"] == metadata, dumped["metadata"]
        got = {t["name"]: t for t in dumped["tensors"]}
        assert set(got) == set(tensors), sorted(got)
        for name, want in tensors.items():
            g = got[name]
            assert g["dtype"] == NAMES[want.dtype], (name, g["dtype"])
            assert g["shape"] == list(want.shape), (name, g["shape"])
            values = torch.tensor(g["values"], dtype=torch.float64 if want.is_floating_point()
                                  else torch.int64)
            assert torch.equal(values, want.reshape(-1).to(values.dtype)), \
                f"{name}: {values} != {want}"
        # Data order follows offsets, whatever the header's key order.
        offsets = [t["name"] for t in dumped["tensors"]]
        assert offsets == (list(tensors)[::-1] if reverse else list(tensors)), offsets
    print(f"EPL read torch's files: {len(tensors)} tensors and metadata match, padded or not")


def check_rejects(tool, folder):
    """A file torch would write wrongly (overlapping tensors) must be refused by name."""
    path = os.path.join(folder, "bad.safetensors")
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + torch.ones(2).numpy().tobytes())
    out = subprocess.run([tool, "dump", path], capture_output=True, text=True)
    assert out.returncode == 1 and f"`{path}`" in out.stderr and "overlap" in out.stderr, out
    print("EPL refused an overlapping file:", out.stderr.strip())


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="epl-st-") as folder:
        check_ours_in_torch(tool, folder)
        check_torch_in_ours(tool, folder)
        check_rejects(tool, folder)


if __name__ == "__main__":
    main()

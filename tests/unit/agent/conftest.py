"""Helpers to write small safetensors files by hand (no torch on the controller)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], list[float]]], metadata=None) -> None:
    """tensors: name -> (dtype 'F32', shape, flat values)."""
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, values) in tensors.items():
        assert dtype == "F32"
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_f32(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, spec in header.items():
        b, e = spec["data_offsets"]
        data = raw[8 + n + b: 8 + n + e]
        out[name] = (spec["shape"], list(struct.unpack(f"<{len(data) // 4}f", data)))
    return out


@pytest.fixture
def st_writer():
    return write_safetensors


@pytest.fixture
def st_reader():
    return read_f32

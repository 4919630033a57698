"""One base shard in, one merged shard out, streaming: bounded memory, every byte hashed on the way.

The shard is read front to back exactly once (its SHA-256 is the input's identity), cut into blocks of at most
``BLOCK_BYTES`` of whole rows; a block that takes a LoRA term (or FP8 dequantization) goes to a worker thread
(numpy releases the GIL), the others pass through. A writer thread writes the blocks in order and hashes them.
At most ``DEPTH`` blocks are alive at any time (recycled buffer pairs), so the peak memory is bounded by
``rss_bound``: the interpreter with numpy + DEPTH x (BLOCK_BYTES read + 2 x BLOCK_BYTES written: an FP8 block
doubles as BF16) + the O_DIRECT buffer + per worker thread 3 float32 scratch rows + the cached LoRA terms,
whatever the shard's or the model's size.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import queue
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import Any

import numpy as np

from ktdeploy.agent import safetensors_io as st
from ktdeploy.agent.merge import arith
from ktdeploy.agent.merge.layout import MergeError, Target, Term

BLOCK_BYTES = 4 << 20
DEPTH = 8


THREAD_ALLOWANCE = 1 << 20     # per thread: its stack and its malloc arena's touched pages


def rss_bound(baseline: int, workers: int, lora_cache_bytes: int, widest_row: int = 0) -> int:
    """The merge's peak RSS bound in bytes. ``baseline``: the process after its imports and its plan (headers, the
    tensor map), before the first data block; ``widest_row``: elements of the widest merged row, which sets the
    scratch when wider than SUB_ELEMS. The threads: ``workers``, the input hasher, the writer and the reader."""
    scratch = 3 * 4 * max(arith.SUB_ELEMS, widest_row)
    threads = workers + 3
    return (baseline + DEPTH * 3 * BLOCK_BYTES + _Out.CAP + workers * scratch + threads * THREAD_ALLOWANCE
            + lora_cache_bytes)


@dataclass
class ShardPlan:
    """What one output shard holds: the input's tensors in file order, dropped ones left out."""

    name: str
    path: Path                         # the base shard
    tensors: list[st.TensorInfo]       # in offset order, covering the data region
    header_len: int                    # 8 + JSON header bytes in the input
    metadata: dict[str, str]
    targets: dict[str, Target]
    dropped: set[str]
    file_size: int

    def out_dtype(self, info: st.TensorInfo) -> str:
        t = self.targets.get(info.name)
        return t.out_dtype if t is not None else info.dtype

    def out_tensors(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        out = []
        for info in self.tensors:
            if info.name in self.dropped:
                continue
            dt = self.out_dtype(info)
            out.append((info.name, dt, info.shape, (info.nbytes // st.ITEMSIZE[info.dtype]) * st.ITEMSIZE[dt]
                        if st.ITEMSIZE[info.dtype] else 0))
        return out

    @property
    def verbatim_header(self) -> bool:
        """Names, dtypes and sizes unchanged: the output's header is the input's, byte for byte."""
        return not self.dropped and all(self.out_dtype(i) == i.dtype for i in self.tensors)

    def header(self) -> bytes:
        """A new header (FP8 -> BF16 changes sizes): same order and metadata, 8-byte aligned like safetensors."""
        h: dict = {"__metadata__": self.metadata} if self.metadata else {}
        pos = 0
        for name, dt, shape, nbytes in self.out_tensors():
            h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
            pos += nbytes
        blob = json.dumps(h, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        return struct.pack("<Q", len(blob)) + blob

    def out_size(self) -> int:
        if self.verbatim_header:
            return self.file_size
        return len(self.header()) + sum(n for *_, n in self.out_tensors())

    def data_bytes(self) -> int:
        return sum(n for *_, n in self.out_tensors())


def check_contiguous(path: Path, tensors: dict[str, st.TensorInfo], size: int) -> tuple[list[st.TensorInfo], int]:
    """The tensors in file order; refuses gaps, overlaps or trailing bytes (the header is then copied verbatim)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    pos = 8 + n
    ordered = sorted(tensors.values(), key=lambda i: (i.begin, i.end))
    for info in ordered:
        if info.begin != pos:
            raise MergeError(f"{path}: tensor {info.name} starts at byte {info.begin}, expected {pos} (gap or "
                             "overlap in the data region)", fix="the file is damaged; download it again")
        pos = info.end
    if pos != size:
        raise MergeError(f"{path}: {size - pos} bytes after the last tensor", fix="the file is damaged; download it again")
    return ordered, 8 + n


class LoraCache:
    """A/B of recent terms as float32, read on demand from the adapter files (a fused [E, 2I, H] target needs 2E
    of them; a per-expert one needs one)."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self.items: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.fds: dict[str, int] = {}

    def _read(self, s: st.Slice) -> np.ndarray:
        fd = self.fds.get(s.path)
        if fd is None:
            fd = self.fds[s.path] = os.open(s.path, os.O_RDONLY | os.O_NOFOLLOW)
        raw = os.pread(fd, s.nbytes, s.offset)
        if len(raw) != s.nbytes:
            raise MergeError(f"{s.path} ended early", fix="the adapter file changed while merging; copy it again")
        return arith.to_f32(np.frombuffer(raw, dtype=np.uint8), s.dtype).reshape(s.shape)

    def get(self, term: Term, b_factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(A, B x b_factor) of ``term`` as float32 (``b_factor`` a power of two: exact)."""
        key = (term.a.path, term.a.offset, term.b.offset, b_factor)
        hit = self.items.get(key)
        if hit is None:
            b = self._read(term.b)
            if b_factor != 1.0:
                b = b * np.float32(b_factor)
            hit = (np.ascontiguousarray(self._read(term.a)), np.ascontiguousarray(b))
            self.items[key] = hit
            while len(self.items) > self.keep:
                self.items.popitem(last=False)
        else:
            self.items.move_to_end(key)
        return hit

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class _Pipeline:
    """Ordered write of results computed in parallel; input and output SHA-256 on their own threads.

    ``DEPTH`` pairs of buffers (BLOCK_BYTES in, 2 x BLOCK_BYTES out) are allocated once and recycled: a block
    takes a pair when it is read and gives it back when it is written and hashed, so nothing is allocated (or
    zeroed, or page-faulted in) per block, and at most ``DEPTH`` blocks are in flight."""

    def __init__(self, out: _Out, workers: int, depth: int = DEPTH) -> None:
        self.out = out
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(depth):
            self.free.put((bytearray(BLOCK_BYTES), bytearray(2 * BLOCK_BYTES)))
        self.hin, self.hout = hashlib.sha256(), hashlib.sha256()
        self.hin_pool = ThreadPoolExecutor(1, thread_name_prefix="merge-hash")
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="merge-calc")
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.written = 0
        self.writer = threading.Thread(target=self._write_loop, name="merge-write", daemon=True)
        self.writer.start()

    def take(self, n: int, src: FileIO) -> tuple[memoryview, memoryview, tuple]:
        """(input view filled with ``n`` bytes of ``src``, output buffer, token to give back); blocks while
        ``DEPTH`` blocks are in flight. A block larger than the pooled buffers (a row over BLOCK_BYTES) uses
        buffers of its own while holding a pool pair, so the bound on blocks in flight still holds."""
        token = self.free.get()
        if self.error is not None:
            self.free.put(token)
            raise self.error
        inbuf, outbuf = token if n <= len(token[0]) else (bytearray(n), bytearray(2 * n))
        view = memoryview(inbuf)[:n]
        _read_into(src, view)
        return view, memoryview(outbuf), token

    def put(self, data: memoryview, outbuf: memoryview, token: tuple,
            result: bytes | None = None, fn: Callable[..., Any] | None = None, *args: Any) -> None:
        """Hash ``data``; the output is ``result`` (bytes), ``fn(data, outbuf, *args)`` or ``data`` itself."""
        hashed = self.hin_pool.submit(self.hin.update, data)
        if fn is not None:
            out: object = self.pool.submit(fn, data, outbuf, *args)
        else:
            out = result if result is not None else data
        self.q.put((out, hashed, token))

    def _write_loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            out, hashed, token = item
            try:
                if self.error is None:
                    res = out.result() if isinstance(out, Future) else out
                    view = memoryview(res).cast("B")
                    if len(view):
                        self.out.write(view)
                        self.hout.update(view)
                        self.written += len(view)
                    hashed.result()
            except BaseException as err:  # noqa: BLE001 - handed to the reading thread, re-raised there
                self.error = self.error or err
            finally:
                self.free.put(token)

    def close(self) -> tuple[str, str, int]:
        self.q.put(None)
        self.writer.join()
        self.pool.shutdown(wait=True)
        self.hin_pool.shutdown(wait=True)
        if self.error is not None:
            raise self.error
        return self.hin.hexdigest(), self.hout.hexdigest(), self.written

    def abort(self) -> None:
        self.error = self.error or MergeError("interrupted", fix="run the same merge again: it resumes")
        self.q.put(None)
        self.writer.join()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.hin_pool.shutdown(wait=True)


class _Out:
    """The output file, written with O_DIRECT through a page-aligned buffer: a profile of the merge showed a third
    of its CPU in the kernel copying written blocks into fresh page-cache pages; direct I/O hands the buffer to the
    disk instead. The tail is padded to the alignment and the file truncated to its size. Where the filesystem
    refuses O_DIRECT (tmpfs), plain writes."""

    ALIGN = 4096
    CAP = 8 << 20

    def __init__(self, path: Path):
        # a new file (O_EXCL, O_NOFOLLOW, as core/safeio's writer) in the staging folder this process created and
        # holds locked; the raw descriptor is what O_DIRECT needs, and the rename into place is the caller's
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        self.size = 0
        self.n = 0
        self.direct = False
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_DIRECT)
            self.direct = True
            self.buf = mmap.mmap(-1, self.CAP)
        except OSError:
            pass

    def write(self, view: memoryview) -> None:
        self.size += len(view)
        if not self.direct:
            self._all(view)
            return
        while len(view):
            k = min(len(view), self.CAP - self.n)
            self.buf[self.n:self.n + k] = view[:k]
            self.n += k
            view = view[k:]
            if self.n == self.CAP:
                self._all(memoryview(self.buf))
                self.n = 0

    def _all(self, view: memoryview) -> None:
        while len(view):
            k = os.write(self.fd, view)
            view = view[k:]

    def close(self) -> None:
        """Flush, set the exact size, fsync, close."""
        try:
            if self.direct:
                if self.n:
                    padded = -(-self.n // self.ALIGN) * self.ALIGN
                    self.buf[self.n:padded] = bytes(padded - self.n)
                    self._all(memoryview(self.buf)[:padded])
                os.ftruncate(self.fd, self.size)
                self.buf.close()
            os.fsync(self.fd)
        finally:
            os.close(self.fd)

    def abandon(self) -> None:
        if self.direct:
            self.buf.close()
        os.close(self.fd)


def _read_into(f: FileIO, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise MergeError(f"{f.name} ended early", fix="the base file changed while merging; copy it again")
        got += k


def write_shard(plan: ShardPlan, dest: Path, *, scale: float, workers: int, scales: dict[str, tuple[Path, st.TensorInfo]],
                block: list[int] | None, cache: LoraCache) -> tuple[str, str, int]:
    """Stream ``plan.path`` into ``dest`` (created exclusively, fsynced); returns (input sha256, output sha256,
    bytes written)."""
    out = _Out(dest)
    with open(plan.path, "rb", buffering=0) as src:
        pipe = _Pipeline(out, workers)
        try:
            head, hbuf, token = pipe.take(plan.header_len, src)
            pipe.put(head, hbuf, token, result=None if plan.verbatim_header else plan.header())
            for info in plan.tensors:
                target = plan.targets.get(info.name)
                if info.name in plan.dropped:
                    _pass(pipe, src, info.nbytes, drop=True)
                elif target is None:
                    _pass(pipe, src, info.nbytes)
                else:
                    _merge_tensor(pipe, src, target, scale, scales, block, cache)
            hin, hout, written = pipe.close()
        except BaseException:
            pipe.abort()
            out.abandon()
            raise
        out.close()
    return hin, hout, written


def _pass(pipe: _Pipeline, src: FileIO, nbytes: int, drop: bool = False) -> None:
    left = nbytes
    while left:
        n = min(left, BLOCK_BYTES)
        data, outbuf, token = pipe.take(n, src)
        pipe.put(data, outbuf, token, result=b"" if drop else None)
        left -= n


def _merge_tensor(pipe: _Pipeline, src: FileIO, target: Target, scale: float,
                  scales: dict[str, tuple[Path, st.TensorInfo]], block: list[int] | None, cache: LoraCache) -> None:
    info = target.info
    rows, cols = target.rows, target.cols
    row_bytes = cols * st.ITEMSIZE[info.dtype]
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    fp8 = None
    if target.scale_inv is not None:
        spath, sinfo = scales[target.scale_inv]
        assert block is not None   # a scale_inv target comes from fp8_targets, made with the base's block size
        fp8 = _load_scale(spath, sinfo, block)
    terms = sorted(target.terms, key=lambda t: t.row0)
    fold = arith.power_of_two(scale)     # s * (B @ A) == (s * B) @ A bit for bit: the multiply pass is saved
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        data, outbuf, token = pipe.take((r1 - r0) * row_bytes, src)
        loras = []
        for t in terms:
            if t.row1 <= r0 or t.row0 >= r1:
                continue
            a, b = cache.get(t, scale if fold else 1.0)
            loras.append(arith.Lora(t.row0, t.row1, b, a))
        pipe.put(data, outbuf, token, None, arith.merge_rows, info.dtype, target.out_dtype, r1 - r0, cols, r0,
                 loras, 1.0 if fold else scale, fp8)


def _load_scale(path: Path, info: st.TensorInfo, block: list[int]) -> arith.BlockScale:
    raw = bytearray(info.nbytes)
    with open(path, "rb", buffering=0) as f:
        f.seek(info.begin)
        _read_into(f, memoryview(raw))
    s = arith.to_f32(np.frombuffer(raw, dtype=np.uint8), info.dtype).reshape(info.shape)
    return arith.BlockScale(np.ascontiguousarray(s), int(block[0]), int(block[1]))

"""Messages between the evaluator and its child over pipes: a JSON header, then raw tensor bytes.

    send(fd, {"op": "output"}, [loss])           # the child
    header, tensors = receive(fd, deadline, limit)   # the parent

A message is an 8-byte little-endian length, that many bytes of JSON (an object), then the
bytes of each tensor its ``"tensors"`` list describes (dtype name and shape), contiguous, in
order. Nothing is unpickled: what the child sends can describe tensors and numbers, never
code, and the reader checks every size against ``limit`` before it allocates.
"""
from __future__ import annotations

import json
import math
import os
import select
import time

import torch

DTYPES = {name: getattr(torch, name) for name in ("float64", "float32", "bfloat16", "float16", "int64", "int32",
                                                  "uint8", "bool")}
HEADER_LIMIT = 1 << 20


class ChannelClosed(Exception):
    """The other end closed the pipe (the process exited or died)."""


class ChannelTimeout(Exception):
    """Nothing complete arrived before the deadline."""


class ChannelError(Exception):
    """A message that is not one this module writes (its text says what is wrong)."""


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def send(fd: int, header: dict, tensors: list[torch.Tensor] = ()) -> None:
    """Write ``header`` (JSON-able) and ``tensors`` (any device; copied to the host) to ``fd``."""
    host = [t.detach().to("cpu").contiguous() for t in tensors]
    header = {**header, "tensors": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                                    for t in host]}
    body = json.dumps(header).encode()
    _write_all(fd, len(body).to_bytes(8, "little") + body)
    for t in host:
        if t.numel():
            _write_all(fd, t.reshape(-1).view(torch.uint8).numpy())


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytearray:
    """``n`` bytes from ``fd``, waiting until ``deadline`` (``time.monotonic()``; None: for ever)."""
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
            raise ChannelTimeout(f"no complete message within the time limit ({got} of {n} bytes)")
        chunk = os.read(fd, min(n - got, 1 << 22))
        if not chunk:
            raise ChannelClosed("the other end closed the channel")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    return out


def receive(fd: int, deadline: float, limit: int) -> tuple[dict, list[torch.Tensor]]:
    """The next message on ``fd``: (header, tensors on the host).

    Args:
        deadline: ``time.monotonic()`` value after which to give up.
        limit: the most bytes all of the message's tensors may hold together.
    Raises:
        ChannelClosed: the writer is gone; ChannelTimeout: past ``deadline``;
        ChannelError: a malformed header, an unknown dtype or tensors above ``limit``.
    """
    size = int.from_bytes(_read_exactly(fd, 8, deadline), "little")
    if size > HEADER_LIMIT:
        raise ChannelError(f"a header of {size} bytes (at most {HEADER_LIMIT})")
    try:
        header = json.loads(bytes(_read_exactly(fd, size, deadline)))
        specs = [(DTYPES[s["dtype"]], [int(n) for n in s["shape"]]) for s in header["tensors"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ChannelError(f"a malformed header ({type(err).__name__}: {err})") from None
    if not isinstance(header, dict) or any(n < 0 for _, shape in specs for n in shape):
        raise ChannelError("a malformed header")
    nbytes = [math.prod(shape) * dtype.itemsize for dtype, shape in specs]
    if sum(nbytes) > limit:
        raise ChannelError(f"tensors of {sum(nbytes)} bytes (at most {limit} expected)")
    tensors = []
    for (dtype, shape), n in zip(specs, nbytes, strict=True):
        data = _read_exactly(fd, n, deadline) if n else None
        flat = torch.frombuffer(data, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
        tensors.append(flat.view(dtype).reshape(shape))
    return header, tensors


def send_command(fd: int, command: dict) -> None:
    """Write one JSON command (the parent to the child)."""
    body = json.dumps(command).encode()
    _write_all(fd, len(body).to_bytes(8, "little") + body)


def receive_command(fd: int) -> dict | None:
    """The next command on ``fd`` (blocking), or None when the parent closed the pipe."""
    try:
        size = int.from_bytes(_read_exactly(fd, 8, None), "little")
        return json.loads(bytes(_read_exactly(fd, size, None)))
    except ChannelClosed:
        return None

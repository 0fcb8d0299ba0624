"""Point-to-point messages between rank processes without tags, each checked before use.

NCCL pairs sends and receives by their order alone (tags are ignored, pytorch
issues #94819, #125079), so :mod:`verify.dist` never relies on tags: every
rank walks its program from :func:`pipesim.comms.lower_comms`, in which the two
ends of every pair of ranks issue their messages in one order derived from the
schedule (the rule and why it cannot deadlock are in :mod:`pipesim.comms`).
gloo on the CPU runs in exactly the same untagged, ordered mode, so the CPU
test suite proves the order that NCCL will see.

Every message is one buffer of bytes: a fixed-size header, then its payload
(one ``isend`` per message, as torch's runtime posts; a separate header message
doubled the gloo/NCCL operations and was most of pipesim's overhead). The header
names the sender, the receiver, the producing and consuming actions, the dtype
and the shape; the receiver compares it with what it expects before it touches
the payload, so a mismatch is a :class:`TransportError` naming both ranks and
the action, never a silently wrong tensor. When the two ends even disagree on the
payload's size in bytes, the receive itself fails (gloo: at once, "size mismatch";
NCCL: at the deadline), again as a :class:`TransportError` naming both ranks and
the action. Both halves are posted
non-blocking (``isend`` / ``irecv``: torch's runtime posts receives the same
way and waits only when the consuming action runs), and every wait has a
deadline: on timeout, or when the peer has gone away, the error names the rank,
the action it waited for and the peer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pipesim.actions import Action, Op
from pipesim.comms import Message
from verify.errors import RunFailedError

__all__ = ["HEADER_LENGTH", "OrderedTransport", "TransportError", "decode_header", "encode_header"]

_MAGIC = 0x50495045  # "PIPE"
_MAX_DIMS = 8
HEADER_LENGTH = 12 + _MAX_DIMS
"""int64 entries of a header: magic, src, dst, producer (3), consumer (3), dtype, ndim, dims,
and one spare that makes it 160 bytes, so the payload behind it is aligned for every dtype."""
_HEADER_BYTES = HEADER_LENGTH * 8
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_OPS = tuple(Op)


class TransportError(RunFailedError):
    """A message did not arrive, arrived late, or is not the one the receiver expects."""


def encode_header(message: Message, dtype: torch.dtype, shape: tuple[int, ...]) -> list[int]:
    """The header of ``message`` carrying a tensor of ``dtype`` and ``shape``.

    >>> from pipesim.actions import parse_action
    >>> m = Message(producer=parse_action("0F1"), consumer=parse_action("1F1"),
    ...             src_rank=0, dst_rank=1, index=2)
    >>> decode_header(encode_header(m, torch.float32, (8, 96)))
    ((0, 1, '0F1', '1F1'), 'torch.float32', (8, 96))
    """
    if dtype not in _DTYPES:
        raise TransportError(f"cannot send a tensor of dtype {dtype} ({message})")
    if len(shape) > _MAX_DIMS:
        raise TransportError(f"cannot send a tensor of {len(shape)} dimensions ({message})")
    p, c = message.producer, message.consumer
    header = [
        _MAGIC,
        message.src_rank,
        message.dst_rank,
        p.stage,
        _OPS.index(p.op),
        p.microbatch,
        c.stage,
        _OPS.index(c.op),
        c.microbatch,
        _DTYPES.index(dtype),
        len(shape),
        *shape,
    ]
    return header + [0] * (HEADER_LENGTH - len(header))


def decode_header(
    values: list[int],
) -> tuple[tuple[int, int, str, str], str, tuple[int, ...]] | None:
    """``((src, dst, producer, consumer), dtype, shape)`` from a header; None if it is not one."""
    if len(values) != HEADER_LENGTH or values[0] != _MAGIC:
        return None
    try:
        producer = Action(stage=values[3], op=_OPS[values[4]], microbatch=values[5])
        consumer = Action(stage=values[6], op=_OPS[values[7]], microbatch=values[8])
        dtype = _DTYPES[values[9]]
    except (IndexError, ValueError):
        return None
    shape = tuple(values[11 : 11 + values[10]])
    return (values[1], values[2], str(producer), str(consumer)), str(dtype), shape


class OrderedTransport:
    """One rank's end of the untagged, ordered messages of a step.

    ``shapes`` gives each cross-rank message's ``(shape, dtype)``, known before
    the step (the receiver allocates its buffer when it posts the receive).
    ``timeout_s`` bounds every wait. ``on_wait(message, peer)`` is called
    before each blocking wait (the launcher shows it if the run hangs).
    """

    def __init__(
        self,
        *,
        rank: int,
        device: torch.device,
        shapes: Mapping[Message, tuple[tuple[int, ...], torch.dtype]],
        timeout_s: float,
        on_wait: Callable[[Message | None, int], None] | None = None,
    ) -> None:
        self.rank, self.device, self.shapes = rank, device, shapes
        self.timeout_s = timeout_s
        self.on_wait = on_wait
        # By message index (hashing a Message hashes its two actions, every lookup).
        self.shape_of = {m.index: shape_dtype for m, shape_dtype in shapes.items()}
        self.pending: dict[int, tuple[Message, Any, Tensor]] = {}
        self.sends: list[tuple[Message, Any, Tensor]] = []
        self.polling = device.type == "cuda"  # NCCL's wait() does not block the host
        # Each message's header, made once and kept for every step (on the device, so that
        # packing and checking it are one copy and one comparison there).
        self.headers: dict[int, Tensor] = {}
        # What went on the wire: payload bytes (headers excluded) and dtypes, all steps.
        self.payload_bytes_sent = 0
        self.dtypes_sent: set[torch.dtype] = set()

    def header(self, message: Message) -> Tensor:
        """``message``'s header as int64 on this rank's device (made once per message)."""
        header = self.headers.get(message.index)
        if header is None:
            shape, dtype = self.shape_of[message.index]
            values = encode_header(message, dtype, tuple(shape))
            header = torch.tensor(values, dtype=torch.int64, device=self.device)
            self.headers[message.index] = header
        return header

    def send(self, message: Message, tensor: Tensor) -> None:
        """Post ``tensor`` (header first) to ``message.dst_rank``; returns at once."""
        shape, dtype = self.shape_of[message.index]
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise TransportError(
                f"rank {self.rank} was to send {message} as {_describe(shape, dtype)} but "
                f"produced {_describe(tuple(tensor.shape), tensor.dtype)}"
            )
        packed = torch.empty(_HEADER_BYTES + tensor.nbytes, dtype=torch.uint8, device=self.device)
        packed[:_HEADER_BYTES].view(torch.int64).copy_(self.header(message))
        _payload_of(packed, shape, dtype).copy_(tensor.detach())
        try:
            work = dist.isend(packed, message.dst_rank)
        except RuntimeError as exc:  # the peer has gone away (gloo: connection closed)
            raise self._failed(f"could not send {message}", message.dst_rank, exc) from None
        self.sends.append((message, work, packed))
        self.payload_bytes_sent += tensor.nbytes
        self.dtypes_sent.add(dtype)

    def post(self, message: Message) -> None:
        """Post the receives of ``message``'s header and payload; returns at once."""
        shape, dtype = self.shape_of[message.index]
        nbytes = dtype.itemsize * _numel(shape)
        packed = torch.empty(_HEADER_BYTES + nbytes, dtype=torch.uint8, device=self.device)
        try:
            work = dist.irecv(packed, message.src_rank)
        except RuntimeError as exc:
            where = f"could not post the receive of {message} needed by {message.consumer}"
            raise self._failed(where, message.src_rank, exc) from None
        self.pending[message.index] = (message, work, packed)

    def take(self, message: Message) -> Tensor:
        """Wait for ``message`` (posted before), check its header, return its payload."""
        _, work, packed = self.pending.pop(message.index)
        self._wait(work, message, "")
        shape, dtype = self.shape_of[message.index]
        header = packed[:_HEADER_BYTES].view(torch.int64)
        if not torch.equal(header, self.header(message)):
            got = decode_header(header.tolist())
            seen = (
                "something that is not a pipesim header"
                if got is None
                else f"{got[0][2]} -> {got[0][3]} from rank {got[0][0]} to rank {got[0][1]} as "
                f"{got[1]} {list(got[2])}"
            )
            raise TransportError(
                f"rank {self.rank} expected {message.producer} -> {message.consumer} from rank "
                f"{message.src_rank} as {_describe(shape, dtype)}, but received {seen}; the "
                "two ranks disagree on the order or the shape of their messages"
            )
        return _payload_of(packed, shape, dtype)

    def finish(self) -> None:
        """Wait until every posted send has left (end of the step)."""
        for message, work, _ in self.sends:
            self._wait(work, message, "", peer=message.dst_rank)
        self.sends = []
        if self.pending:
            left = ", ".join(str(m) for m, _, _ in self.pending.values())
            raise TransportError(f"rank {self.rank} posted receives it never used: {left}")

    def _failed(self, what: str, peer: int, exc: Exception) -> TransportError:
        text = _first_words(str(exc)) or type(exc).__name__
        return TransportError(f"rank {self.rank} {what} (peer: rank {peer}): {text}")

    def _wait(self, work: Any, message: Message, what: str, *, peer: int | None = None) -> None:
        peer = message.src_rank if peer is None else peer
        if self.on_wait is not None:
            self.on_wait(message, peer)
        deadline = time.monotonic() + self.timeout_s
        try:
            if self.polling:
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    time.sleep(1e-5)
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=self.timeout_s))
        except (RuntimeError, TimeoutError) as exc:
            text = _first_words(str(exc)) or "timed out"
            if message.dst_rank == self.rank:
                waited = f"for {what or 'the'} message {message} needed by {message.consumer}"
            else:
                waited = f"until rank {peer} took message {message} sent by {message.producer}"
            raise TransportError(
                f"rank {self.rank} waited {waited} and gave up after at most "
                f"{self.timeout_s:g} s (peer: rank {peer}): {text}"
            ) from None
        finally:
            if self.on_wait is not None:
                self.on_wait(None, -1)


def _payload_of(packed: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """The payload part of a packed message, viewed (not copied) as ``dtype`` and ``shape``."""
    return packed[_HEADER_BYTES:].view(dtype).view(shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _describe(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{dtype} {list(shape)}"


def _first_words(text: str) -> str:
    """gloo's message without its source location and advice: ``[pair.cc:537] Read error
    ...: Connection reset by peer. This is typically ...`` -> ``Read error ...: Connection
    reset by peer``."""
    lines = text.strip().splitlines()
    first = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else ""
    return first.split(". This is typically")[0]

"""Hard limits checked before anything is allocated, and the dtype whitelist."""

from __future__ import annotations

import dataclasses

# name -> itemsize; names are numpy's, so the client can use np.dtype(name) directly, but for
# bfloat16, which numpy lacks (the client's gpud_client.bfloat16 stands in for it).
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
}

F32_MAX = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one message may hold. The daemon checks each before allocating; the welcome tells the
    client, which splits its batches to stay within them."""

    max_header_bytes: int = 4 << 20
    max_ops_per_batch: int = 4096
    max_frames: int = 1024
    # One allocation. Not a message bound: an upload larger than a message travels in parts
    # (`UploadPart`), a readback in reply parts; the session quota and the device bound tensors too.
    max_tensor_bytes: int = 1 << 36
    max_message_bytes: int = (1 << 30) + (4 << 20)  # header and payload frames together
    max_ndim: int = 8
    max_args: int = 32
    max_source_bytes: int = 1 << 20
    max_name_len: int = 128
    max_options: int = 32
    max_handle: int = (1 << 31) - 1
    max_grid: int = (1 << 31) - 1
    max_devices: int = 64
    max_graph_steps: int = 4096  # recorded ops per graph
    max_graph_tensors: int = 1024  # inputs, scalars, bound tensors, intermediates and outputs of a graph, each
    reply_part_bytes: int = 4 << 20  # a readback's data travels in messages of at most this many bytes
    max_replay_steps: int = 1024  # steps of one multi-step replay (`ReplaySteps`)
    max_slots: int = 1024  # slots of a slot graph (`GraphDef.slots`): sessions whose rows one launch holds

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


DEFAULT_LIMITS = Limits()

"""gpud wire protocol: message schema, encode/decode, limits and error codes.

Depends on msgpack only. Nothing here ever unpickles: arrays travel as a header (whitelisted
dtype, shape, nbytes) in msgpack plus a raw ZeroMQ frame.
"""

from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.limits import DEFAULT_LIMITS, DTYPE_SIZES, Limits
from gpud_protocol.messages import (
    BYE,
    PING,
    PONG,
    PROTOCOL_VERSION,
    REQUEST_OPCODES,
    Alloc,
    Arg,
    ArgKind,
    Batch,
    Bye,
    ClientMessage,
    Copy,
    Dispatch,
    Free,
    FlushOp,
    Hello,
    KernelOptions,
    Op,
    Opcode,
    OpError,
    Open,
    Ping,
    Publish,
    Readback,
    RegisterKernel,
    ServerMessage,
    Stats,
    Sync,
    Unpublish,
    Upload,
    decode_client_message,
    decode_server_message,
    encode_batch,
    encode_error,
    encode_error_reply,
    encode_hello,
    encode_reply,
    pack,
)

__version__ = "0.1.0"

__all__ = [
    "BYE", "DEFAULT_LIMITS", "DTYPE_SIZES", "PING", "PONG", "PROTOCOL_VERSION", "REQUEST_OPCODES",
    "Alloc", "Arg", "ArgKind", "Batch", "Bye", "ClientMessage", "Copy", "Dispatch", "ErrorCode",
    "Free", "FlushOp", "Hello", "KernelOptions", "Limits", "Op", "OpError", "Opcode", "Open", "Ping",
    "ProtocolViolation", "Publish", "Readback", "RegisterKernel", "ServerMessage", "Stats", "Sync",
    "Unpublish", "Upload", "decode_client_message", "decode_server_message", "encode_batch",
    "encode_error", "encode_error_reply", "encode_hello", "encode_reply", "pack",
]

"""Async client for gpud. Needs anyio, pyzmq, numpy and msgpack; no GPU packages."""

from gpud_client.client import Client, connect
from gpud_client.dtypes import bfloat16
from gpud_client.errors import (
    AlreadyExists,
    Busy,
    CompileError,
    DaemonLost,
    DeviceLost,
    GpudError,
    InternalError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    ProtocolError,
    SessionLost,
)
from gpud_client.graph_tensors import GraphScalar, GraphTensor
from gpud_client.graphs import Graph
from gpud_client.residents import Resident
from gpud_client.scope import Scope
from gpud_client.steps import Step
from gpud_client.tensor import Tensor
from gpud_client.traces import Trace
from gpud_client.transport import default_address
from gpud_client.values import Kernel, Scalar, f32, i32, u32

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "Busy",
    "Client",
    "CompileError",
    "DaemonLost",
    "DeviceLost",
    "GpudError",
    "Graph",
    "GraphScalar",
    "GraphTensor",
    "InternalError",
    "InvalidArgument",
    "Kernel",
    "NotFound",
    "OutOfMemory",
    "PermissionDenied",
    "ProtocolError",
    "Resident",
    "Scalar",
    "Scope",
    "SessionLost",
    "Step",
    "Tensor",
    "Trace",
    "bfloat16",
    "connect",
    "default_address",
    "f32",
    "i32",
    "u32",
]

"""transformers' BertModel in this process on gpud's encoder weights: the same embeddings (masked mean,
L2 normalisation), eager and as one CUDA graph per batch shape, for `gpud bench embed`.

Each call takes host arrays and returns host arrays, as a gpud client's call does: the ids and mask
go to the device, the embeddings come back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Embed = Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any]], np.ndarray[Any, Any]]
WARMUP = 3  # runs on a side stream before a capture, as torch.cuda.graphs asks


def load(weights: Path, device: str = "cuda", dtype: str = "float16") -> Any:
    """BertModel (no pooler) from `weights`' config.json and model.safetensors, in `dtype` on `device`."""
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(weights / "config.json"))
    model = BertModel(config, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(load_file(str(weights / "model.safetensors")), strict=False)
    missing = [name for name in missing if not name.endswith(("position_ids", "token_type_ids"))]  # buffers
    if missing or unexpected:
        raise ValueError(f"{weights}: the weights do not fit BertModel: missing {missing}, unexpected {unexpected}")
    return model.to(device=torch.device(device), dtype=getattr(torch, dtype)).eval()


def _forward(model: Any, ids: Any, mask: Any) -> Any:
    import torch

    states = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    weights = mask.unsqueeze(-1).float()
    pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2.0, dim=-1)


def eager(model: Any) -> Embed:
    import torch

    device = next(model.parameters()).device

    def embed(ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        with torch.inference_mode():
            ids_t = torch.from_numpy(ids.astype(np.int64)).to(device)
            mask_t = torch.from_numpy(mask.astype(np.int64)).to(device)
            return np.asarray(_forward(model, ids_t, mask_t).cpu().numpy())

    return embed


def graphed(model: Any) -> Embed:
    """One CUDA graph per (batch, length), captured on first use; a call copies the inputs in and replays."""
    import torch

    device = next(model.parameters()).device
    graphs: dict[tuple[int, ...], tuple[Any, Any, Any, Any]] = {}

    def capture(shape: tuple[int, ...]) -> tuple[Any, Any, Any, Any]:
        ids = torch.zeros(shape, dtype=torch.int64, device=device)
        mask = torch.ones(shape, dtype=torch.int64, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(WARMUP):
                _forward(model, ids, mask)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            out = _forward(model, ids, mask)
        return graph, ids, mask, out

    def embed(ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        graph, ids_t, mask_t, out = graphs.get(ids.shape) or graphs.setdefault(ids.shape, capture(ids.shape))
        ids_t.copy_(torch.from_numpy(ids.astype(np.int64)))
        mask_t.copy_(torch.from_numpy(mask.astype(np.int64)))
        graph.replay()
        return np.asarray(out.cpu().numpy())

    return embed

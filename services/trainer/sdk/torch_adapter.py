"""PyTorch adapter of the elastic SDK: a `torch.nn.Module`'s parameters and gradients as
named numpy arrays. Imports torch, so only users of this adapter need the `torch` extra.

    model = TorchModel(net)
    job.initialize(model.state())
    ...  model.load(task.pull()); loss.backward(); task.push(model.gradients(), samples=n)

Names are the module's `named_parameters()` names. An `nn.Embedding(..., sparse=True)`
yields its gradient as sparse rows `(indices, rows)`. Buffers stay local to each trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from tideshift.services.trainer.port.pserver_client import Gradient


class TorchModel:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.parameters = dict(module.named_parameters())
        if not self.parameters:
            raise ValueError("the module has no parameters")

    def state(self) -> dict[str, np.ndarray]:
        """Every parameter as a numpy array (a copy)."""
        return {name: p.detach().cpu().numpy().copy() for name, p in self.parameters.items()}

    def load(self, arrays: Mapping[str, Any]) -> None:
        """Set the parameters from named arrays (e.g. `task.pull()`)."""
        with torch.no_grad():
            for name, param in self.parameters.items():
                param.copy_(torch.as_tensor(np.asarray(arrays[name]), dtype=param.dtype))

    def gradients(self) -> dict[str, Gradient]:
        """The gradients of the last backward pass (then cleared); sparse ones as rows."""
        result: dict[str, Gradient] = {}
        for name, param in self.parameters.items():
            grad = param.grad
            if grad is None:
                continue
            if grad.is_sparse:
                grad = grad.coalesce()
                result[name] = (
                    grad.indices()[0].cpu().numpy().astype(np.int64),
                    grad.values().cpu().numpy(),
                )
            else:
                result[name] = grad.detach().cpu().numpy().copy()
            param.grad = None
        return result

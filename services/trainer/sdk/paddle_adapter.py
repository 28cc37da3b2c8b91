"""PaddlePaddle adapter of the elastic SDK: a `paddle.nn.Layer`'s parameters and gradients as
named numpy arrays. Imports paddle, so only users of this adapter need the `paddle` extra.

    model = PaddleModel(net)
    job.initialize(model.state())
    ...  model.load(task.pull()); loss.backward(); task.push(model.gradients(), samples=n)

Names are the layer's `named_parameters()` names. An `nn.Embedding(..., sparse=True)`
yields its gradient as sparse rows `(indices, rows)`, so a batch ships only the rows it
touched. Buffers (batch-norm running statistics) stay local to each trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle

from tideshift.services.trainer.port.pserver_client import Gradient


class PaddleModel:
    def __init__(self, layer: paddle.nn.Layer) -> None:
        self.layer = layer
        self.parameters = dict(layer.named_parameters())
        if not self.parameters:
            raise ValueError("the layer has no parameters")

    def state(self) -> dict[str, np.ndarray]:
        """Every trainable parameter as a numpy array (a copy)."""
        return {name: np.array(param.numpy()) for name, param in self.parameters.items()}

    def load(self, arrays: Mapping[str, Any]) -> None:
        """Set the parameters from named arrays (e.g. `task.pull()`)."""
        for name, param in self.parameters.items():
            param.set_value(np.asarray(arrays[name], dtype=param.numpy().dtype))

    def gradients(self) -> dict[str, Gradient]:
        """The gradients of the last backward pass; parameters without one are left out.
        Clears them, so the next batch starts from zero."""
        result: dict[str, Gradient] = {}
        for name, param in self.parameters.items():
            grad = param.grad
            if grad is None:
                continue
            if grad.is_selected_rows():
                rows = np.asarray(grad.rows(), dtype=np.int64)
                result[name] = (rows, np.array(grad._get_tensor_from_selected_rows()))
            else:
                result[name] = np.array(grad.numpy())
        self.layer.clear_gradients()
        return result

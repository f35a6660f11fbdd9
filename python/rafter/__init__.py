"""rafter: compile a model once, run it fast; run LLMs.

Two lines deploy a model::

    import rafter
    m = rafter.compile("model.onnx", dims={"seq": "<=512"})   # or a torch.nn.Module
    y = m(x)                                                   # numpy or torch in and out

* :func:`compile` takes an ONNX file, a compiled artifact (``.rfa``) or a
  ``torch.nn.Module`` with example inputs; :func:`load` opens an artifact.
* A :class:`Model` is called with numpy arrays or DLPack tensors (torch tensors on the
  CPU are read in place; results come back as torch tensors without a copy when the
  inputs were torch tensors). :meth:`Model.submit` returns a future; the GIL is released
  while rafter runs, so calls from several threads overlap.
* :class:`LLM` opens a Hugging Face folder, a GGUF file or an LLM artifact and generates
  text, streamed or whole.
* Every failure raises a subclass of :class:`Error`.
"""

from rafter._rafter import (
    CompileError,
    DeviceError,
    Error,
    InputError,
    LLMError,
    ModelError,
    RunError,
    Tensor,
    __version__,
)
from rafter._model import Future, Model, Port, compile, devices, load
from rafter._llm import LLM

__all__ = [
    "compile",
    "load",
    "devices",
    "Model",
    "Port",
    "Future",
    "Tensor",
    "LLM",
    "Error",
    "ModelError",
    "CompileError",
    "InputError",
    "RunError",
    "DeviceError",
    "LLMError",
    "__version__",
]

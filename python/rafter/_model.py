"""Compile, load, call and submit models (the Python side of rafter._rafter.Model)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
import threading
import warnings
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from rafter import _rafter
from rafter._rafter import CompileError, InputError, ModelError

#: The first bytes of every rafter artifact.
ARTIFACT_MAGIC = b"RAFTRFA\x00"

#: rafter's dtype names and numpy's (bf16 has no numpy dtype).
_NUMPY_DTYPES = {
    "f32": "float32",
    "f64": "float64",
    "f16": "float16",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "bool": "bool",
}

PathLike = Union[str, "os.PathLike[str]"]


class Port(NamedTuple):
    """An input or output of a model: its name, dtype (``"f32"``, ``"i64"``...) and dims,
    each an ``int`` when fixed or the symbolic text (``"seq"``, ``"seq + 1"``) when not."""

    name: str
    dtype: str
    dims: List[Union[int, str]]


class Future(concurrent.futures.Future):
    """The result of :meth:`Model.submit`: a :class:`concurrent.futures.Future` that can
    also be awaited (``y = await m.submit(x)``)."""

    def __await__(self):
        return asyncio.wrap_future(self).__await__()


class Model:
    """A compiled model bound to its devices. Call it from any thread.

    ``m(x)``, ``m(x1, x2)`` or ``m(input_ids=..., attention_mask=...)`` runs one call and
    returns the output (a model with one output) or a dict of outputs by name. Inputs are
    numpy arrays, torch tensors on the CPU or any DLPack tensor; lists and scalars are
    converted to the input's dtype. A row-major input is read in place through DLPack, with
    no copy at all when only CPU kernels read it (:attr:`inputs_in_place`); a Fortran-order
    or strided one is copied once. Outputs are numpy arrays, or torch tensors when an input
    was a torch tensor, sharing rafter's memory (no copy).
    """

    def __init__(self, native: _rafter.Model):
        self._native = native

    @property
    def inputs(self) -> List[Port]:
        """The inputs, in positional order."""
        return [Port(n, d, list(dims)) for n, d, dims in self._native.inputs]

    @property
    def outputs(self) -> List[Port]:
        """The outputs, in the order of the result dict."""
        return [Port(n, d, list(dims)) for n, d, dims in self._native.outputs]

    @property
    def devices(self) -> List[str]:
        """The devices the model runs on (``["cpu"]``, ``["cpu", "vulkan"]``)."""
        return self._native.device_names()

    @property
    def inputs_in_place(self) -> List[str]:
        """The inputs that calls read in place from the caller's memory: only CPU kernels
        read them, so a C-contiguous numpy array or contiguous torch CPU tensor of the right
        dtype is never copied (a Fortran-order, strided or misaligned one is copied once).
        The other inputs are written once into the call's input buffer (for a GPU, the
        upload)."""
        return [p.name for p, f in zip(self.inputs, self._native.input_in_place()) if f]

    @property
    def input_copies(self) -> Dict[str, int]:
        """How many input tensors this model's calls have copied so far: ``"converted"``,
        gathered into a packed tensor (strided, misaligned or bool inputs), and
        ``"written"``, written into a call's input buffer (inputs not read in place). Both
        stay 0 for calls whose inputs are all read in place."""
        converted, written = self._native.input_copies()
        return {"converted": converted, "written": written}

    def plan(self) -> str:
        """The report ``rafter plan`` prints, to the byte: inputs, outputs and bounds, the
        steps in dispatch order with the ops fused into each kernel and its device, the
        buffers, the weights, and each device's planned memory."""
        return self._native.plan()

    def save(self, path: PathLike) -> int:
        """Writes the model as an artifact (``.rfa``) that :func:`load` opens; returns its
        size in bytes."""
        return self._native.save(os.fspath(path))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs, like = self._gather(args, kwargs)
        return self._wrap(self._native.run(inputs), like)

    def submit(self, *args: Any, **kwargs: Any) -> Future:
        """Starts a call and returns at once with a :class:`Future` of its result (the
        value ``m(...)`` would return). Inputs read in place (:attr:`inputs_in_place`) are
        read while the call runs: the call keeps them alive until its work has completed
        (even if the future is dropped), and they must not be modified before the future
        resolves."""
        inputs, like = self._gather(args, kwargs)
        call = self._native.submit(inputs)
        future = Future()
        future.set_running_or_notify_cancel()

        def finish() -> None:
            try:
                future.set_result(self._wrap(call.wait(), like))
            except BaseException as e:  # noqa: BLE001 - handed to the future's owner
                future.set_exception(e)

        threading.Thread(target=finish, name="rafter-call", daemon=True).start()
        return future

    def __repr__(self) -> str:
        ins = ", ".join(f"{p.name}: {p.dtype}{p.dims}" for p in self.inputs)
        outs = ", ".join(f"{p.name}: {p.dtype}{p.dims}" for p in self.outputs)
        return f"rafter.Model(({ins}) -> ({outs}) on {'+'.join(self.devices)})"

    # -- inputs and outputs ------------------------------------------------------------

    def _gather(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Tuple[list, str]:
        """The inputs in the model's order, as DLPack-capable objects, and the kind of
        result to give back (``"torch"`` when an input is a torch tensor)."""
        ports = self.inputs
        names = [p.name for p in ports]
        if len(args) > len(ports):
            raise InputError(
                f"the model takes {len(ports)} inputs ({', '.join(names)}), got {len(args)}"
            )
        slots: List[Any] = list(args) + [None] * (len(ports) - len(args))
        given = [True] * len(args) + [False] * (len(ports) - len(args))
        for name, value in kwargs.items():
            if name not in names:
                raise InputError(
                    f"the model has no input `{name}` (inputs: {', '.join(names)})"
                )
            k = names.index(name)
            if given[k]:
                raise InputError(f"input `{name}` given twice")
            slots[k], given[k] = value, True
        missing = [n for n, g in zip(names, given) if not g]
        if missing:
            raise InputError(f"missing inputs: {', '.join(missing)} (inputs: {', '.join(names)})")
        like = "numpy"
        out = []
        for port, value in zip(ports, slots):
            if _is_torch(value):
                like = "torch"
                # Read in place through DLPack; a strided tensor is gathered by rafter.
                out.append(value.detach() if value.requires_grad else value)
            elif isinstance(value, np.ndarray):
                # numpy exports only writable, native-endian arrays through legacy DLPack.
                if not value.flags.writeable or not value.dtype.isnative:
                    value = np.array(value, dtype=value.dtype.newbyteorder("="), order="C")
                out.append(value)
            elif hasattr(value, "__dlpack__"):
                out.append(value)
            else:
                dtype = _NUMPY_DTYPES.get(port.dtype)
                try:
                    out.append(np.ascontiguousarray(np.asarray(value, dtype=dtype)))
                except (TypeError, ValueError) as e:
                    raise InputError(f"input `{port.name}`: cannot read {type(value).__name__} as {port.dtype}: {e}") from None
        return out, like

    def _wrap(self, outputs: List[_rafter.Tensor], like: str) -> Any:
        arrays = [_export(t, like) for t in outputs]
        if len(arrays) == 1:
            return arrays[0]
        return {p.name: a for p, a in zip(self.outputs, arrays)}


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "is_contiguous")


def _export(t: _rafter.Tensor, like: str) -> Any:
    """A rafter tensor as a numpy array or torch tensor viewing its memory."""
    if like == "torch":
        import torch

        return torch.from_dlpack(t)
    if t.dtype == "bf16":
        return t  # numpy has no bfloat16: keep the DLPack tensor (torch.from_dlpack reads it)
    return np.from_dlpack(t)


def _parse_dims(dims: Optional[Mapping[str, Union[int, str]]]) -> List[Tuple[str, int]]:
    """``{"seq": "<=512", "batch": 4}`` as ``[("seq", 512), ("batch", 4)]``: each symbol's
    upper bound (an int or ``"N"`` is the bound N too, as ``rafter compile --dim``)."""
    out = []
    for name, spec in (dims or {}).items():
        text = str(spec).strip()
        if text.startswith("<="):
            text = text[2:].strip()
        try:
            n = int(text)
        except ValueError:
            raise CompileError(
                f"dims[{name!r}] = {spec!r}: expected an upper bound such as '<=512' or 512"
            ) from None
        out.append((str(name), n))
    return out


def _check_threads(threads: Any) -> None:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise CompileError(f"threads = {threads!r}: expected a count >= 0 (0: one per core)")


def _is_artifact(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(ARTIFACT_MAGIC)) == ARTIFACT_MAGIC
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from None


def compile(
    model: Any,
    example_inputs: Any = None,
    *,
    target: str = "cpu",
    dims: Optional[Mapping[str, Union[int, str]]] = None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    dynamic_axes: Optional[Mapping[str, Mapping[int, str]]] = None,
    opset: int = 17,
    threads: int = 0,
    exporter: str = "torchscript",
) -> Model:
    """Compiles a model for ``target`` and binds it to the devices.

    ``model`` is one of:

    * a path to an ONNX model: imported and compiled;
    * a path to a rafter artifact (told apart by its first bytes, not its extension):
      loaded as :func:`load` does (``dims`` must then be empty);
    * a ``torch.nn.Module``: exported with ``torch.onnx.export`` over ``example_inputs``
      (a tensor or a tuple of tensors), then compiled. ``input_names``, ``output_names``
      and ``dynamic_axes`` (``{"x": {0: "batch"}}``) go to the exporter; without
      ``dynamic_axes`` every dim is fixed to the example's. ``exporter="torchscript"``
      (the default) needs only torch; ``exporter="dynamo"`` traces with ``torch.export``
      and needs the onnxscript package.

    ``target`` is ``"cpu"``, ``"vulkan"`` (kernels the GPU supports go there, the rest
    stay on the CPU) or ``"auto"`` (``"vulkan"`` when a Vulkan device opens, else
    ``"cpu"``). ``dims`` bounds the model's symbolic dims, ``{"seq": "<=512"}``, so memory is
    planned for the largest call. ``threads`` is the CPU threads the model's calls use
    (0, the default: one per core); with ``threads=1`` calls from several Python threads
    each take a core.

    Raises :class:`ModelError` for a file that cannot be read, :class:`CompileError` for a
    model or option the compiler rejects, :class:`DeviceError` for a device that cannot be
    opened.
    """
    _check_threads(threads)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if _is_artifact(path):
            if dims:
                raise CompileError(
                    f"{path} is a compiled artifact: its dims were fixed when it was compiled"
                )
            return load(path, threads=threads)
        return Model(_rafter.compile_onnx(path, target, _parse_dims(dims), threads))
    if _is_torch_module(model):
        if example_inputs is None:
            raise CompileError("compiling a torch.nn.Module needs example_inputs")
        with tempfile.TemporaryDirectory(prefix="rafter-") as tmp:
            path = os.path.join(tmp, "model.onnx")
            _export_torch(model, example_inputs, path, input_names, output_names, dynamic_axes,
                          opset, exporter)
            return Model(_rafter.compile_onnx(path, target, _parse_dims(dims), threads))
    raise CompileError(
        f"cannot compile a {type(model).__name__}: pass an ONNX path, an artifact path or a "
        "torch.nn.Module with example_inputs"
    )


def _is_torch_module(model: Any) -> bool:
    torch = __import__("sys").modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


#: The exporters ``compile(torch_module, exporter=...)`` takes.
EXPORTERS = ("torchscript", "dynamo")


def _export_torch(module, example_inputs, path, input_names, output_names, dynamic_axes, opset,
                  exporter):
    """``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``, no extra
    packages), or with ``dynamo=True``: ``torch.export`` traces the module and onnxscript
    writes the ONNX model (``pip install onnxscript``)."""
    import torch

    if exporter not in EXPORTERS:
        raise CompileError(f"exporter = {exporter!r}: expected one of {', '.join(EXPORTERS)}")
    if exporter == "dynamo":
        try:
            import onnxscript  # noqa: F401 - torch's dynamo exporter needs it
        except ImportError:
            raise CompileError(
                "exporter='dynamo' needs the onnxscript package (pip install onnxscript); "
                "exporter='torchscript' needs nothing more than torch"
            ) from None
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    kwargs = dict(
        input_names=list(input_names) if input_names else None,
        output_names=list(output_names) if output_names else None,
        dynamic_axes=dict(dynamic_axes) if dynamic_axes else None,
        opset_version=opset,
    )
    if exporter == "dynamo":
        # One self-contained file (weights inside), the exporter's console report off, and
        # opset 18 at least: the exporter writes 18 and converting down fails on ReduceMean.
        kwargs.update(external_data=False, verbose=False, opset_version=max(opset, 18))
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript exporter is deprecated upstream but needs no extra packages;
            # its warnings (and dynamo's) are not the user's to act on.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            if exporter == "dynamo":
                torch.onnx.export(module, args, path, dynamo=True, **kwargs)
            else:
                try:
                    torch.onnx.export(module, args, path, dynamo=False, **kwargs)
                except TypeError:  # a torch without the `dynamo` argument
                    torch.onnx.export(module, args, path, **kwargs)
    except Exception as e:  # noqa: BLE001 - the exporter raises many types
        raise CompileError(f"torch.onnx.export ({exporter}) failed: {type(e).__name__}: {e}") from e
    finally:
        module.train(was_training)


def load(path: PathLike, threads: int = 0) -> Model:
    """Opens a compiled artifact (memory-mapped, checksums verified) and binds it to the
    devices it was compiled for; its calls use ``threads`` CPU threads (0: one per core)."""
    _check_threads(threads)
    return Model(_rafter.load(os.fspath(path), threads))


def devices() -> List[Dict[str, Any]]:
    """The devices rafter can use here: ``[{"name": "cpu", "kind": "cpu", "available":
    True, "cores": 16}, {"name": "vulkan", "kind": "gpu", "available": False, "error":
    "..."}]``."""
    return _rafter.devices()

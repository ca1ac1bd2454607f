"""Device arrays in a snapshot: torch tensors, parameters and modules, and JAX arrays.

Without this module a torch tensor pickles *in band* (torch serializes its storage into
the stream: one more copy of every byte), and a CUDA tensor would either fail or need the
GPU in the middle of unpickling. Here, instead:

- **torch**: a tensor (``torch.Tensor`` or ``torch.nn.Parameter``, strided, on CPU or
  CUDA) pickles as its *storage* plus offset, size, stride, dtype, ``requires_grad`` and
  ``.grad``. The storage becomes a segment of its own (see ``pickling``), once however many
  tensors view it, so views keep sharing memory after restore. A CPU storage is handed
  over as a memory view of the tensor's own memory: no copy. A CUDA storage is a
  :class:`~runtime.snapshot.transfer.DeviceSource`: ``transfer`` copies it to host part by
  part through pinned staging buffers, so a 40 GB model needs a few parts of host memory,
  not 40 GB. Modules pickle as usual; their parameters and buffers are tensors.
- **JAX**: a single-device ``jax.Array`` pickles as its bytes plus dtype, shape and device.
  On CPU the bytes are a view of the array (no copy); on an accelerator a ``DeviceSource``
  copies bounded slices of it. It comes back with ``jax.device_put`` from one host buffer
  per array (JAX arrays are immutable: there is no device buffer to fill in place).
- Everything else (sparse, quantized, sharded arrays, tensor subclasses) keeps its
  library's own pickling.

On restore each device segment goes back to the device it came from (type and index): a
torch CUDA storage is filled part by part through staging buffers, verified bytes only.
:func:`restore_refusal` decides first, from the manifest alone, whether this kernel can:
another accelerator type is refused (as GKE refuses a Pod Snapshot), as is a kernel
without the accelerator, unless the user asked for device arrays on CPU.

Per kernel the entry records the accelerators seen (:func:`seen`): type, count, NVIDIA
driver and CUDA versions. Only libraries the kernel already imported are looked at: the
capture never imports torch or JAX, and never initializes CUDA itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import RestoreRefused

#: What a device segment's placement says: which library rebuilds it, and where it was.
TORCH, JAX = "torch", "jax"

Register = Callable[[Any, dict[str, Any]], "Token"]


class Token:
    """Stands for one segment inside the pickle stream (``pickling`` turns it into a
    persistent id); memoized per storage, so shared storages are stored once."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _torch() -> Any:
    return sys.modules.get("torch")


def _jax() -> Any:
    return sys.modules.get("jax")


# -- accelerators ---------------------------------------------------------------------------


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version through NVML (what ``nvidia-smi`` shows), or None."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buffer = ctypes.create_string_buffer(96)
        try:
            if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(96)) != 0:
                return None
        finally:
            nvml.nvmlShutdown()
        return buffer.value.decode() or None
    except (OSError, AttributeError):
        return None


def seen(placements: Iterable[Mapping[str, Any] | None] = ()) -> dict[str, Any]:
    """The accelerators this kernel uses: ``{"type", "count", "driver", "cuda",
    "framework"}`` (type None and count 0 without one). torch counts when CUDA is
    initialized in the kernel; JAX when one of its arrays is on an accelerator."""
    torch = _torch()
    if torch is not None and torch.cuda.is_initialized():
        count = torch.cuda.device_count()
        return {"type": torch.cuda.get_device_name(0) if count else None, "count": count,
                "driver": _nvidia_driver(), "cuda": torch.version.cuda, "framework": TORCH}
    jax = _jax()
    platforms = {str(p.get("device", "")).split(":")[0] for p in placements
                 if p and p.get("kind") == JAX} - {"cpu"}
    if jax is not None and platforms:
        platform = sorted(platforms)[0]
        devices = jax.devices(platform)
        driver = _nvidia_driver() if platform in ("gpu", "cuda") else None
        return {"type": devices[0].device_kind if devices else None, "count": len(devices),
                "driver": driver, "cuda": None, "framework": JAX}
    return {"type": None, "count": 0, "driver": None, "cuda": None, "framework": None}


def needed(placements: Iterable[Mapping[str, Any] | None],
           sizes: Iterable[int]) -> dict[str, int]:
    """Bytes of the snapshot per accelerator device (``{"cuda:0": n}``); CPU left out."""
    found: dict[str, int] = {}
    for placement, size in zip(placements, sizes, strict=True):
        device = str((placement or {}).get("device") or "cpu")
        if not device.startswith("cpu"):
            found[device] = found.get(device, 0) + int(size)
    return found


def restore_refusal(recorded: Mapping[str, Any] | None, devices: Mapping[str, int],
                    here: Mapping[str, Any], *, to_cpu: bool) -> str | None:
    """None if a kernel with accelerators ``here`` (as :func:`seen` describes them) may
    restore a snapshot holding ``devices`` bytes per device, captured with ``recorded``;
    else why not, in words for the user. Pure."""
    if not devices or to_cpu:
        return None
    recorded = recorded or {}
    kind = recorded.get("type") or "an accelerator"
    held = ", ".join(f"{_gib(n)} on {d}" for d, n in sorted(devices.items()))
    advice = (f"resume it on a profile with {kind}, or with its device arrays on CPU "
              "(`stasis ws resume --device-arrays-to-cpu`)")
    if not here.get("count"):
        return f"the snapshot holds device arrays ({held}) of {kind} and this kernel has " \
               f"no accelerator: {advice}"
    if recorded.get("type") and here.get("type") != recorded.get("type"):
        return (f"the snapshot holds device arrays ({held}) of {recorded['type']} and this "
                f"kernel has {here.get('type')}, another accelerator type: {advice}")
    highest = max(_index(d) for d in devices)
    if highest >= int(here.get("count") or 0):
        return (f"the snapshot holds device arrays on {_device_name(devices, highest)} and "
                f"this kernel sees {here.get('count')} x {here.get('type')}: {advice}")
    return None


def _index(device: str) -> int:
    tail = device.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _device_name(devices: Mapping[str, int], index: int) -> str:
    return next(d for d in devices if _index(d) == index)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_restore(entry: Mapping[str, Any], *, to_cpu: bool) -> None:
    """Raise :class:`RestoreRefused` if this kernel cannot take ``entry``'s device
    arrays (see :func:`restore_refusal`); imports the libraries it needs to look."""
    devices = needed(entry.get("placements") or [], entry.get("segments") or [])
    if not devices or to_cpu:
        return
    here = _accelerators_here({str(p.get("kind")) for p in entry.get("placements") or [] if p})
    why = restore_refusal(entry.get("accelerators"), devices, here, to_cpu=to_cpu)
    if why is not None:
        raise RestoreRefused(why)


def _accelerators_here(kinds: set[str]) -> dict[str, Any]:
    if TORCH in kinds:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            return {"type": torch.cuda.get_device_name(0) if count else None, "count": count}
        return {"type": None, "count": 0}
    if JAX in kinds:
        import jax

        for platform in ("gpu", "tpu"):
            with contextlib.suppress(RuntimeError):
                found = jax.devices(platform)
                if found:
                    return {"type": found[0].device_kind, "count": len(found)}
    return {"type": None, "count": 0}


# -- capture --------------------------------------------------------------------------------


class _TorchCuda:
    """A CUDA storage as a ``DeviceSource``: bytes copied to pinned host buffers."""

    def __init__(self, storage: Any) -> None:
        torch = _torch()
        self._bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        self.nbytes = int(storage.nbytes())

    def read_into(self, offset: int, view: memoryview) -> None:
        _PINNED.tensor(view).copy_(self._bytes[offset: offset + len(view)])

    def staging(self, size: int) -> memoryview:
        return _PINNED.new(size)


class _TorchCudaSink:
    """A CUDA storage to restore into: allocated on its device, filled part by part."""

    def __init__(self, device: str, nbytes: int) -> None:
        torch = _torch() or __import__("torch")
        self.value = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.nbytes = nbytes

    def write_from(self, offset: int, view: memoryview) -> None:
        self.value[offset: offset + len(view)].copy_(_PINNED.tensor(view))

    def staging(self, size: int) -> memoryview:
        return _PINNED.new(size)


class _Pinned:
    """Pinned host buffers, and the tensor over a view of one of them (so copies to and
    from the GPU are DMA from page-locked memory, not staged again by the driver).

    One registry for every source and sink (the transfer stages all device segments
    through the buffers of the first), holding the buffers weakly: they live as long as
    the transfer's staging views, which keep their tensors alive through ``numpy()``.
    """

    def __init__(self) -> None:
        self._buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def new(self, size: int) -> memoryview:
        torch = _torch()
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self._buffers[pinned.data_ptr()] = pinned
        return memoryview(pinned.numpy()).cast("B")

    def tensor(self, view: memoryview) -> Any:
        torch = _torch()
        flat = torch.frombuffer(view, dtype=torch.uint8)
        address = flat.data_ptr()
        for start, pinned in list(self._buffers.items()):
            if start <= address < start + pinned.numel():
                return pinned[address - start: address - start + len(view)]
        return flat


_PINNED = _Pinned()


class _JaxDevice:
    """A JAX array on an accelerator as a ``DeviceSource``: bounded slices to host."""

    def __init__(self, array: Any) -> None:
        self._flat = array.reshape(-1)
        self._itemsize = int(array.dtype.itemsize)
        self.nbytes = int(array.nbytes)

    def read_into(self, offset: int, view: memoryview) -> None:
        import numpy as np

        first, count = offset // self._itemsize, len(view) // self._itemsize
        chunk: Any = np.ascontiguousarray(np.asarray(self._flat[first: first + count]))
        view[:] = memoryview(chunk.view(np.uint8)).cast("B")

    def staging(self, size: int) -> memoryview:
        return memoryview(bytearray(size))


@dataclass
class Reducers:
    """The reductions ``pickling``'s pickler applies to device arrays, with ``register``
    (segment, placement) -> :class:`Token` handing segments to the dump."""

    register: Register
    keep: list[Any]

    def __post_init__(self) -> None:
        self._storages: dict[tuple[str, int, int], Token] = {}

    def reduce(self, obj: Any) -> Any:
        """A reduction for ``obj``, or ``NotImplemented`` for everything not ours."""
        torch = _torch()
        if torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
            return self._torch_tensor(torch, obj)
        jax = _jax()
        if jax is not None and isinstance(obj, jax.Array):
            return self._jax_array(obj)
        return NotImplemented

    def _torch_tensor(self, torch: Any, tensor: Any) -> Any:
        if (tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested
                or tensor.is_conj() or tensor.is_neg()
                or tensor.device.type not in ("cpu", "cuda")):
            return NotImplemented
        if tensor.requires_grad and not tensor.is_leaf:
            raise TypeError("cannot pickle a non-leaf tensor that requires grad "
                            "(detach() it, or keep the leaves it came from)")
        token = self._torch_storage(torch, tensor.untyped_storage())
        return (_rebuild_torch_tensor,
                (token, tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()),
                 str(tensor.dtype).removeprefix("torch."), bool(tensor.requires_grad),
                 type(tensor) is torch.nn.Parameter, tensor.grad))

    def _torch_storage(self, torch: Any, storage: Any) -> Token:
        device = str(storage.device)
        key = (device, int(storage.data_ptr()), int(storage.nbytes()))
        token = self._storages.get(key) if key[1] else None
        if token is not None:
            return token
        segment: Any
        if storage.device.type == "cpu":
            as_bytes = torch.empty(0, dtype=torch.uint8).set_(storage)
            array = as_bytes.numpy()
            self.keep.extend((as_bytes, array))
            segment = memoryview(array).cast("B")
        else:
            segment = _TorchCuda(storage)
        token = self.register(segment, {"kind": TORCH, "device": device})
        if key[1]:
            self._storages[key] = token
        return token

    def _jax_array(self, array: Any) -> Any:
        devices = array.devices() if array.is_fully_addressable else set()
        if len(devices) != 1:
            return NotImplemented  # sharded: JAX's own pickling (gathers to host)
        device = next(iter(devices))
        where = f"{device.platform}:{device.id}"
        if device.platform == "cpu":
            import numpy as np

            host: Any = np.ascontiguousarray(np.asarray(array))
            self.keep.append(host)
            segment: Any = memoryview(host.view(np.uint8)).cast("B")
        else:
            segment = _JaxDevice(array)
        token = self.register(segment, {"kind": JAX, "device": where})
        return (_rebuild_jax_array, (token, str(array.dtype), tuple(array.shape)))


# -- restore --------------------------------------------------------------------------------


def target_device(placement: Mapping[str, Any], *, to_cpu: bool) -> str:
    """Where a device segment goes back to: its own device, or ``cpu`` when asked."""
    device = str(placement.get("device") or "cpu")
    return "cpu" if to_cpu or device.startswith("cpu") else device


def sinks_for(placements: list[Mapping[str, Any] | None], sizes: list[int], *,
              to_cpu: bool) -> dict[int, Any]:
    """A device sink for every torch segment that goes back onto an accelerator; every
    other segment is restored into host memory."""
    found: dict[int, Any] = {}
    for index, placement in enumerate(placements):
        if not placement or placement.get("kind") != TORCH:
            continue
        device = target_device(placement, to_cpu=to_cpu)
        if device != "cpu":
            found[index] = _TorchCudaSink(device, sizes[index])
    return found


def loader(placements: list[Mapping[str, Any] | None], restored: list[Any], *,
           to_cpu: bool) -> Callable[[int], Any]:
    """``persistent_load`` for segment tokens: the object a segment stands for (a torch
    storage, or JAX's host bytes with their target device), built once per segment."""
    built: dict[int, Any] = {}

    def load(index: int) -> Any:
        if index in built:
            return built[index]
        placement = placements[index] or {}
        buffer = restored[index]
        if placement.get("kind") == TORCH:
            import torch

            if hasattr(buffer, "value"):  # a device sink: already on its device
                value = buffer.value.untyped_storage()
            elif len(buffer):
                value = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
            else:
                value = torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
        elif placement.get("kind") == JAX:
            value = (buffer, target_device(placement, to_cpu=to_cpu))
        else:
            raise ValueError(f"segment {index} is no device segment")
        built[index] = value
        return value

    return load


def _rebuild_torch_tensor(storage: Any, offset: int, size: tuple[int, ...],
                          stride: tuple[int, ...], dtype: str, requires_grad: bool,
                          parameter: bool, grad: Any) -> Any:
    import torch

    tensor = torch.empty((0,), dtype=getattr(torch, dtype), device=storage.device)
    tensor.set_(storage, offset, size, stride)
    if parameter:
        tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
    elif requires_grad:
        tensor.requires_grad_(True)
    if grad is not None:
        tensor.grad = grad
    return tensor


def _rebuild_jax_array(source: tuple[Any, str], dtype: str, shape: tuple[int, ...]) -> Any:
    import jax
    import numpy as np

    buffer, device = source
    platform, _, index = device.partition(":")
    host = np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)
    target = jax.devices(platform)[int(index or 0)]
    return jax.device_put(host, target)

"""Pickling a notebook namespace (runtime.snapshot.pickling): what is captured, what is
skipped and why, shared references, out-of-band buffers, and functions rebound to the
namespace they are restored into. In-process only: no kernel, no storage."""

from __future__ import annotations

import pickle
import textwrap
from typing import Any

import numpy as np
import pytest

from runtime.snapshot import pickling

NOTEBOOK = textwrap.dedent(
    """
    import numpy as np
    import threading

    counter = 0

    def bump():
        global counter
        counter += 1
        return counter

    class Point:
        def __init__(self, x):
            self.x = x
        def size(self):
            return abs(self.x) + len(weights)

    weights = np.arange(1 << 18, dtype=np.float64)   # 2 MiB: out of band
    small = np.arange(10)                            # in band
    alias = weights
    config = {"weights": weights, "lr": 0.1}
    origin = Point(-2)
    lock = threading.Lock()
    def locked():
        with lock:
            return 1
    pending = (i for i in range(3))
    _cache = {"hits": 1}
    """
)


def notebook() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(NOTEBOOK, namespace)
    # What IPython adds to a kernel's namespace.
    namespace.update({"_": 1, "__": 2, "_i": "x", "_i3": "y", "_5": 5, "_oh": {}, "_ih": []})
    namespace.update({"In": [], "Out": {}, "get_ipython": len, "exit": None, "quit": None})
    return namespace


def round_trip(namespace: dict[str, Any]) -> tuple[dict[str, Any], pickling.NamespaceDump]:
    dump = pickling.dump_namespace(namespace, pickling.user_variables(namespace))
    restored = [bytes(dump.segments[0]), *(bytearray(s) for s in dump.segments[1:])]
    target: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    values = pickling.load_namespace(restored, target, placements=dump.placements)
    assert set(target) == {"__name__", "__builtins__"}  # loading does not apply anything
    target.update(values)
    return target, dump


def test_user_variables_leave_out_ipython_machinery() -> None:
    names = pickling.user_variables(notebook())
    assert names == [
        "np", "threading", "counter", "bump", "Point", "weights", "small", "alias", "config",
        "origin", "lock", "locked", "pending", "_cache",
    ]  # fmt: skip


def test_hidden_names_are_left_out_only_while_ipython_still_owns_them() -> None:
    marker = object()
    namespace = {"display": marker, "mine": 1, "shadowed": 2}
    hidden = {"display": marker, "shadowed": "ipython's"}
    assert pickling.user_variables(namespace, hidden) == ["mine", "shadowed"]


def test_unpicklable_variables_are_skipped_with_type_and_reason() -> None:
    target, dump = round_trip(notebook())
    assert [(s.name, s.type) for s in dump.skipped] == [
        ("lock", "_thread.lock"),
        ("pending", "generator"),
    ]
    assert dump.skipped[0].reason == "TypeError: cannot pickle '_thread.lock' object"
    assert "lock" not in target and "pending" not in target
    # The function that uses the lock is kept; only the lock is missing when it runs.
    with pytest.raises(NameError, match="lock"):
        target["locked"]()


def test_round_trip_keeps_values_sharing_and_classes() -> None:
    source = notebook()
    target, dump = round_trip(source)
    np.testing.assert_array_equal(target["weights"], source["weights"])
    assert target["alias"] is target["weights"]
    assert target["config"]["weights"] is target["weights"]
    assert type(target["origin"]) is target["Point"]
    assert target["origin"].size() == 2 + (1 << 18)
    assert target["np"] is np
    assert target["_cache"] == {"hits": 1}
    captured = {v.name: v for v in dump.captured}
    assert captured["weights"].type == "numpy.ndarray"
    assert captured["weights"].bytes > 2 * 1024 * 1024
    assert captured["alias"].bytes < 100  # a reference to an object already stored
    assert captured["origin"].type == "__main__.Point"


def test_notebook_functions_are_rebound_to_the_restored_namespace() -> None:
    target, _ = round_trip(notebook())
    assert target["bump"].__globals__ is target
    assert target["bump"]() == 1
    assert target["counter"] == 1  # the global update lands in the notebook namespace
    target["weights"] = np.zeros(3)
    assert target["origin"].size() == 2 + 3  # methods see the live namespace too


def test_large_buffers_go_out_of_band_without_a_copy() -> None:
    namespace = notebook()
    dump = pickling.dump_namespace(namespace, pickling.user_variables(namespace))
    assert [s.nbytes for s in dump.segments[1:]] == [namespace["weights"].nbytes]
    namespace["weights"][0] = 42.0
    assert dump.segments[1][:8].cast("d")[0] == 42.0  # a view of the live array
    dump.release()
    assert dump.segments == []


def test_release_lets_the_user_resize_a_captured_bytearray() -> None:
    namespace = {"blob": bytearray(b"x" * 10)}
    dump = pickling.dump_namespace(namespace, ["blob"])
    dump.release()
    namespace["blob"].extend(b"more")


def test_a_stream_with_bound_functions_needs_load_namespace() -> None:
    namespace = notebook()
    dump = pickling.dump_namespace(namespace, ["bump"])
    with pytest.raises(pickle.UnpicklingError, match="load_namespace"):
        pickle.loads(bytes(dump.segments[0]))


def test_a_failed_load_does_not_touch_the_target() -> None:
    namespace = notebook()
    dump = pickling.dump_namespace(namespace, ["counter", "bump"])
    broken = bytes(dump.segments[0])[:-5]
    target: dict[str, Any] = {"keep": 1, "__builtins__": __builtins__}
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises on a cut stream
        pickling.load_namespace([broken], target)
    assert target == {"keep": 1, "__builtins__": __builtins__}


def test_type_names() -> None:
    assert pickling.type_name({}) == "dict"
    assert pickling.type_name(np.zeros(1)) == "numpy.ndarray"


# -- device arrays (CPU here; tests/integration/test_snapshot_gpu.py has the GPU side) ----


def test_torch_tensors_parameters_and_modules_go_out_of_band_sharing_storage() -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(300_000, dtype=torch.float32).reshape(600, 500)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model[0].weight.grad = torch.ones_like(model[0].weight)
    namespace = {"base": base, "rows": base[100:200], "model": model,
                 "half": torch.ones(7, dtype=torch.bfloat16), "frozen": torch.zeros(3)}

    restored, dump = round_trip(namespace)

    kinds = [p for p in dump.placements if p is not None]
    assert {"kind": "torch", "device": "cpu"} in kinds
    # One segment per storage: ``rows`` views ``base`` and is not stored again.
    assert sum(1 for s in dump.segments[1:] if s.nbytes == base.nbytes) == 1
    assert torch.equal(restored["base"], base) and torch.equal(restored["rows"], base[100:200])
    restored["rows"][0, 0] = -1.0
    assert restored["base"][100, 0] == -1.0  # still a view of the same storage
    weight = restored["model"][0].weight
    assert type(weight) is torch.nn.Parameter and weight.requires_grad
    assert torch.equal(weight, model[0].weight) and torch.equal(weight.grad, model[0].weight.grad)
    assert restored["half"].dtype == torch.bfloat16
    assert restored["model"](torch.ones(1, 64)).shape == (1, 2)


def test_capturing_a_cpu_tensor_copies_none_of_its_bytes() -> None:
    torch = pytest.importorskip("torch")
    weights = torch.full((1024, 1024), 3.0)
    dump = pickling.dump_namespace({"weights": weights}, ["weights"])
    (segment,) = dump.segments[1:]
    assert segment.nbytes == weights.nbytes
    weights[0, 0] = 9.0  # the segment is the tensor's memory, not a copy of it
    assert segment[:4].cast("f")[0] == 9.0
    dump.release()


def test_a_non_leaf_tensor_that_requires_grad_is_skipped_with_the_reason() -> None:
    torch = pytest.importorskip("torch")
    leaf = torch.ones(3, requires_grad=True)
    dump = pickling.dump_namespace({"leaf": leaf, "derived": leaf * 2}, ["leaf", "derived"])
    assert [(s.name, s.type) for s in dump.skipped] == [("derived", "torch.Tensor")]
    assert "non-leaf tensor" in dump.skipped[0].reason
    assert [v.name for v in dump.captured] == ["leaf"]


def test_jax_arrays_come_back_on_their_device() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    namespace = {"x": jnp.arange(250_000, dtype=jnp.float32).reshape(500, 500),
                 "b": jnp.ones(10, dtype=jnp.bfloat16), "small": jnp.array([1, 2, 3])}
    restored, dump = round_trip(namespace)
    assert {"kind": "jax", "device": "cpu:0"} in dump.placements
    assert isinstance(restored["x"], jax.Array)
    assert bool((restored["x"] == namespace["x"]).all())
    assert restored["b"].dtype == jnp.bfloat16
    assert restored["x"].devices() == namespace["x"].devices()

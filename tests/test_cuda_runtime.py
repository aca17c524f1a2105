"""hslm_ptx.runtime.cuda.CudaRuntime without a GPU: the stand-in CuPy (tests/data/bench/standin)
over the host memory of CPU torch tensors, its kernels run on the PTX emulator. It checks
what the runtime hands CuPy and torch: no zero-size buffer reaches CuPy's pointer lookup
(which refuses a null pointer, as CuPy 14.2 does), every tensor handed to torch is a view
of a tensor torch allocated, and launches go on a stream made by ``Stream.from_external``
where CuPy has it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hslm_ptx.runtime.cuda import CudaRuntime  # noqa: E402
from hslm_ptx.runtime.emulator import EmulatorRuntime  # noqa: E402
from hslm_ptx.step.launches import SavedActivations, backward, forward, prepare_weight  # noqa: E402

STANDIN_CUPY = Path(__file__).parent / "data" / "bench" / "standin" / "cupy" / "__init__.py"


@pytest.fixture
def cupy(monkeypatch):
    """The stand-in CuPy, importable as ``cupy`` for the test (hslm_ptx.runtime.backends imports it)."""
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "cupy"}
    for k in saved:
        monkeypatch.delitem(sys.modules, k)
    spec = importlib.util.spec_from_file_location("cupy", STANDIN_CUPY)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cupy", module)
    spec.loader.exec_module(module)
    module.Stream.made_from_external = []
    yield module
    for k in [k for k in sys.modules if k.split(".")[0] == "cupy"]:
        del sys.modules[k]
    sys.modules.update(saved)


class AllocationLog:
    """torch, with every tensor its ``empty`` and ``zeros`` make remembered by storage."""

    def __init__(self) -> None:
        self.storages: set[int] = set()

    def __getattr__(self, name):
        return getattr(torch, name)

    def _kept(self, tensor):
        self.storages.add(tensor.untyped_storage()._cdata)
        return tensor

    def empty(self, *args, **kwargs):
        return self._kept(torch.empty(*args, **kwargs))

    def zeros(self, *args, **kwargs):
        return self._kept(torch.zeros(*args, **kwargs))

    def allocated(self, tensor) -> bool:
        """The tensor's storage is one torch.empty / torch.zeros made (not merely the same bytes)."""
        return tensor.untyped_storage()._cdata in self.storages


def _bits(tensor) -> np.ndarray:
    tensor = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    return tensor.contiguous().numpy().view(np.uint8).ravel()


def _host(tensor) -> np.ndarray:
    return tensor.view(torch.int16).numpy().view(np.uint16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def test_the_standin_refuses_a_null_pointer_as_cupy_does(cupy):
    with pytest.raises(ValueError, match="null pointer"):
        cupy.cuda.UnownedMemory(0, 0, None)
    assert cupy.cuda.UnownedMemory(0, 0, None, 0).ptr == 0  # with the device named it is accepted


def test_a_zero_size_tensor_is_viewed_without_a_pointer_lookup(cupy):
    rt = CudaRuntime(cupy, torch, device="cpu")
    for shape, dtype in (((0, 0), torch.int8), ((0,), torch.float32), ((3, 0), torch.bfloat16)):
        array = rt.view(torch.empty(shape, dtype=dtype))
        assert array.shape == shape and array.size == 0
        back = rt.tensor(array, str(dtype).removeprefix("torch."))
        assert tuple(back.shape) == shape and back.dtype == dtype
    assert tuple(rt.empty((0, 4), "int8").shape) == (0, 4)


def test_a_backward_with_a_frozen_weight_runs_and_gives_the_emulators_bits(cupy):
    """Forward kept no codes (no weight gradient to come): backward is handed a (0, 0) codes
    and a (0,) scales tensor, as hslm::linear_backward passes them."""
    torch.manual_seed(3)
    R, K, N = 19, 40, 24
    x, w, dy = (torch.randn(shape, dtype=torch.bfloat16) for shape in ((R, K), (N, K), (R, N)))
    nothing = (torch.empty((0, 0), dtype=torch.int8), torch.empty((0,), dtype=torch.float32))
    rt = CudaRuntime(cupy, torch, device="cpu")
    prepared = prepare_weight(rt, rt.view(w))
    y, _ = forward(rt, rt.view(x), prepared, keep_columns=False)
    dx, dw, db = backward(rt, rt.view(dy), SavedActivations(*(rt.view(t) for t in nothing), R), prepared,
                          need_dx=True, need_dw=False, need_db=False)
    assert dw is None and db is None
    emu = EmulatorRuntime()
    want_prepared = prepare_weight(emu, _host(w))
    want_y, _ = forward(emu, _host(x), want_prepared, keep_columns=False)
    want_dx, _, _ = backward(emu, _host(dy), SavedActivations(np.empty((0, 0), np.int8), np.empty(0, np.float32), R),
                             want_prepared, need_dx=True, need_dw=False, need_db=False)
    assert np.array_equal(_bits(rt.tensor(y, "bfloat16")), want_y.view(np.uint8).ravel())
    assert np.array_equal(_bits(rt.tensor(dx, "bfloat16")), want_dx.view(np.uint8).ravel())


def test_every_tensor_handed_to_torch_is_one_torch_allocated(cupy):
    torch.manual_seed(4)
    R, K, N = 19, 40, 24
    log = AllocationLog()
    rt = CudaRuntime(cupy, log, device="cpu")
    x, w, bias, dy = (torch.randn(shape, dtype=torch.bfloat16) for shape in ((R, K), (N, K), (N,), (R, N)))
    prepared = prepare_weight(rt, rt.view(w))
    y, saved = forward(rt, rt.view(x), prepared, rt.view(bias))
    dx, dw, db = backward(rt, rt.view(dy), saved, prepared, True, True, True)
    handed = [rt.tensor(y, "bfloat16"), rt.tensor(saved.x_t, "int8"), rt.tensor(saved.u, "float32"),
              rt.tensor(dx, "bfloat16"), rt.tensor(dw, "bfloat16"), rt.tensor(db, "float32")]
    assert all(log.allocated(t) for t in handed)
    assert [tuple(t.shape) for t in handed] == [tuple(a.shape) for a in (y, saved.x_t, saved.u, dx, dw, db)]
    # a view shares the bytes: what a kernel writes after the hand-over is what torch sees
    rt.view(handed[0]).view(np.uint8)[...] = 0
    assert not handed[0].view(torch.int16).any()


def test_a_tensor_over_the_same_bytes_but_not_torch_allocated_is_seen(cupy):
    """The check above can fail: a tensor wrapped around the bytes (as the CUDA array
    interface wraps them) shares the address but not the allocator's storage."""
    log = AllocationLog()
    rt = CudaRuntime(cupy, log, device="cpu")
    array = rt.empty((4, 8), "float32")
    wrapped = torch.from_numpy(np.asarray(array))
    assert wrapped.data_ptr() == rt.tensor(array, "float32").data_ptr()
    assert not log.allocated(wrapped) and log.allocated(rt.tensor(array, "float32"))


def test_an_array_the_runtime_did_not_map_is_copied_into_a_torch_tensor(cupy):
    log = AllocationLog()
    rt = CudaRuntime(cupy, log, device="cpu")
    foreign = cupy.ndarray((2, 3), np.float32)
    np.asarray(foreign)[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = rt.tensor(foreign, "float32")
    assert log.allocated(out) and out.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_launches_use_stream_from_external_once_per_stream(cupy, monkeypatch):
    rt = CudaRuntime(cupy, torch, device="cpu")
    w = torch.randn((24, 40), dtype=torch.bfloat16)
    prepare_weight(rt, rt.view(w))
    prepare_weight(rt, rt.view(w))
    assert cupy.Stream.made_from_external == [(0, 0)]  # 4 launches, one stream handle


def test_without_from_external_the_external_stream_is_used(cupy, monkeypatch):
    made = []
    monkeypatch.delattr(cupy.Stream, "from_external")
    monkeypatch.setattr(cupy.cuda, "ExternalStream", lambda ptr, device_id=-1: made.append((ptr, device_id)) or cupy.Stream())
    rt = CudaRuntime(cupy, torch, device="cpu")
    prepare_weight(rt, rt.view(torch.randn((24, 40), dtype=torch.bfloat16)))
    assert made == [(0, 0)] and cupy.Stream.made_from_external == []

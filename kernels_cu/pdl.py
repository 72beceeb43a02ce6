"""Programmatic dependent launch (PDL) of the fast mode's own kernels.

``launch(fn, grid, block, args, shared_mem)`` launches a CuPy ``RawKernel`` through the driver's
``cuLaunchKernelEx`` with the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the
kernel may start before the kernel ahead of it in the stream has finished, as soon as every block
of that one has executed ``griddepcontrol.launch_dependents`` (``dfl::pdl_trigger`` in common.cuh)
or exited. Stream capture records it as a programmatic edge of the CUDA graph.

What a kernel launched this way must do (every kernel passed here does it):
- call ``dfl::pdl_wait`` (``griddepcontrol.wait``) before it reads anything a preceding kernel
  may write, and before it writes anything. After the wait, every earlier kernel of the stream
  has completed (each PDL kernel waited for its own predecessor before it finished);
- before the wait, read only what no kernel of the same sequence writes. Two kernels read there:
  - the attention prefetches context tiles of the rings. block_forward launches it this way. The
    chain of PDL kernels it belongs to (the block's glue kernels, fast_gemv, the attention and its
    combine, each triggering at its top) may span the whole block: with fast_gemv at B1 the
    block's first kernel (fb_resid_norm, itself under PDL) opens it. What comes before that kernel
    is launched the ordinary way (a copy, a cuBLAS GEMM, the ring writes), and an ordinary kernel
    never triggers early, so the chain starts only after every ring write of the stream has
    completed; no kernel of the chain writes a ring. A caller that puts a PDL kernel which writes
    the rings right before the block would break this. The draft_attention Op launches the
    attention the ordinary way;
  - fast_gemv stages its weight rows, which are prepared once and written by no kernel of a round.
- a kernel may trigger before its wait: its successor still waits for it to complete, and it
  completes only after its own wait, so the wait in any kernel covers every kernel before it.

Without a device of compute capability 9.0+, with ``ENABLED`` False (environment variable
``DFLASH_PDL=0``), or with ``pdl=False``, ``launch`` is the ordinary CuPy call; the kernels' wait
and trigger are then no-ops, so the results are the same bits either way (tests/gpu/test_pdl.py).
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

ENABLED = os.environ.get("DFLASH_PDL", "1") != "0"

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h CUlaunchAttributeID


class _Attr(ctypes.Structure):  # cuda.h CUlaunchAttribute: id, 4 bytes of pad, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):  # cuda.h CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


_SCALARS = {np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64,
            np.uint64: ctypes.c_uint64, np.float32: ctypes.c_float, np.float64: ctypes.c_double}


def kernel_arg(a):
    """The ctypes value CuPy's RawKernel would pass for ``a``: a device array's pointer, a NumPy
    scalar's value at its own width. Anything else (a Python int has no width, a host array is no device
    pointer) is a TypeError."""
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    if ptr is not None and hasattr(a, "device"):
        return ctypes.c_void_p(int(ptr))
    kind = _SCALARS.get(type(a))
    if kind is None:
        raise TypeError(f"pdl.launch: argument of type {type(a).__name__} (a CuPy array or a NumPy scalar "
                        "of a fixed width is required)")
    return kind(a.item())


def _dim3(d) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    if not 1 <= len(d) <= 3:
        raise ValueError(f"pdl.launch: a grid / block of {len(d)} dimensions")
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def config(grid, block, shared_mem: int, stream_ptr: int, pdl: bool):
    """(CUlaunchConfig, its attribute array): kept together, the config points into the array."""
    attrs = (_Attr * 1)()
    attrs[0].id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[0].value = (1).to_bytes(4, "little") + bytes(60)  # programmaticStreamSerializationAllowed = 1
    g, b = _dim3(grid), _dim3(block)
    cfg = _Config(*g, *b, int(shared_mem), ctypes.c_void_p(int(stream_ptr)),
                  ctypes.cast(attrs, ctypes.POINTER(_Attr)), 1 if pdl else 0)
    return cfg, attrs


@functools.cache
def _driver():
    from kernels_cu.fast.gemm import loaded_library

    lib = loaded_library("libcuda")
    fn = lib.cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return fn, name


@functools.cache
def _capable(dev_id: int) -> bool:
    import cupy

    return int(cupy.cuda.Device(dev_id).compute_capability) >= 90


def active() -> bool:
    """Whether ``launch`` uses PDL here (ENABLED, and a device of compute capability 9.0+); False where
    CuPy or a device is missing."""
    if not ENABLED:
        return False
    try:
        import cupy

        return _capable(cupy.cuda.Device().id)
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: nothing to launch under PDL
        return False


_LAUNCHED: set[int] = set()  # CUfunction handles launched under PDL here (end_capture relaxes edges into these)


def launch(fn, grid, block, args, shared_mem: int = 0, *, pdl: bool = True) -> None:
    """``fn(grid, block, args, shared_mem=shared_mem)`` on the current CuPy stream, with the PDL
    attribute where ``pdl`` and ``active()``. ``fn`` must follow the module docstring's rules."""
    use = pdl and active()
    if not use:
        fn(grid, block, tuple(args), shared_mem=shared_mem)
        return
    import cupy

    launch_ex, _ = _driver()
    _LAUNCHED.add(int(fn.kernel.ptr))
    values = [kernel_arg(a) for a in args]
    params = (ctypes.c_void_p * max(1, len(values)))(
        *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    cfg, _attrs = config(grid, block, shared_mem, cupy.cuda.get_current_stream().ptr, True)
    _check(launch_ex(ctypes.byref(cfg), ctypes.c_void_p(int(fn.kernel.ptr)), params, None),
           f"cuLaunchKernelEx ({getattr(fn, 'name', fn)})")


# --- CUDA graphs: PDL edges relaxed to launch order ---------------------------------------------------------
#
# Stream capture records a PDL launch as a programmatic edge from the kernel ahead's "programmatic" port:
# the kernel may start once every block ahead has triggered or exited. cuBLAS's kernels never trigger, so
# a glue kernel after a GEMM starts only as the GEMM's blocks exit. ``end_capture`` rewrites every such
# edge to the "launch order" port (CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER): the kernel may start once every
# block ahead has begun, and waits (griddepcontrol.wait) for that kernel's completion as before. Only
# edges that were programmatic change, and only those into a kernel launched through ``launch`` (which
# keeps the rules above: nothing a preceding kernel writes is read before the wait); a library's own PDL
# edges, if any, stay as captured. ``LAUNCH_ORDER`` False keeps every edge as captured.

LAUNCH_ORDER = True

_PORT_PROGRAMMATIC, _PORT_LAUNCH_ORDER, _DEPENDENCY_PROGRAMMATIC = 1, 2, 1  # cuda.h


class _EdgeData(ctypes.Structure):  # cuda.h CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


@functools.cache
def _graph_api():
    from kernels_cu.fast.gemm import loaded_library

    lib = loaded_library("libcuda")
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    sigs = {"cuStreamEndCapture": [p, ctypes.POINTER(p)],
            "cuGraphGetEdges_v2": [p, ctypes.POINTER(p), ctypes.POINTER(p), ctypes.POINTER(_EdgeData),
                                   ctypes.POINTER(sz)],
            "cuGraphRemoveDependencies_v2": [p, ctypes.POINTER(p), ctypes.POINTER(p), ctypes.POINTER(_EdgeData), sz],
            "cuGraphAddDependencies_v2": [p, ctypes.POINTER(p), ctypes.POINTER(p), ctypes.POINTER(_EdgeData), sz],
            "cuGraphInstantiateWithFlags": [ctypes.POINTER(p), p, ctypes.c_ulonglong],
            "cuGraphKernelNodeGetParams_v2": [p, ctypes.c_void_p],
            "cuGraphLaunch": [p, p], "cuGraphExecDestroy": [p], "cuGraphDestroy": [p]}
    api = {}
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
        api[name] = fn
    return api


def _check(rc: int, what: str) -> None:
    if rc != 0:
        _, error_name = _driver()
        s = ctypes.c_char_p()
        error_name(rc, ctypes.byref(s))
        raise RuntimeError(f"{what}: {(s.value or b'?').decode()} ({rc})")


def relax_edges(edges, ours) -> list[int]:
    """Indices of the (from_port, to_port, type) edges to rewrite: programmatic ones on the programmatic
    port whose downstream kernel is ours (``ours[i]``)."""
    return [i for i, (fp, _tp, ty) in enumerate(edges)
            if ty == _DEPENDENCY_PROGRAMMATIC and fp == _PORT_PROGRAMMATIC and ours[i]]


def _kernel_of(node) -> int:
    """The CUfunction of a kernel node (0 for any other node): the first field of CUDA_KERNEL_NODE_PARAMS."""
    buf = (ctypes.c_ubyte * 256)()  # the struct is 80 bytes in cuda.h 12 / 13; room to spare
    if _graph_api()["cuGraphKernelNodeGetParams_v2"](node, ctypes.cast(buf, ctypes.c_void_p)) != 0:
        return 0
    return int.from_bytes(bytes(buf[:8]), "little")


def graph_edges(graph):
    """A graph's edges as ctypes arrays: (from nodes, to nodes, CUgraphEdgeData), all of the same length."""
    api = _graph_api()
    n = ctypes.c_size_t(0)
    _check(api["cuGraphGetEdges_v2"](graph, None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    k = n.value
    frm, to, data = (ctypes.c_void_p * k)(), (ctypes.c_void_p * k)(), (_EdgeData * k)()
    if k:
        _check(api["cuGraphGetEdges_v2"](graph, frm, to, data, ctypes.byref(n)), "cuGraphGetEdges")
    return frm, to, data


def make_programmatic(graph, edges, sel, from_port: int) -> int:
    """Rewrite the edges ``sel`` (indices into graph_edges' arrays ``edges``) as programmatic dependencies from
    ``from_port`` (_PORT_PROGRAMMATIC or _PORT_LAUNCH_ORDER); returns how many."""
    if not sel:
        return 0
    api = _graph_api()
    frm, to, data = edges
    m = len(sel)
    f2, t2 = (ctypes.c_void_p * m)(*[frm[i] for i in sel]), (ctypes.c_void_p * m)(*[to[i] for i in sel])
    old = (_EdgeData * m)(*[data[i] for i in sel])
    new = (_EdgeData * m)()
    for j in range(m):
        new[j].from_port, new[j].type = from_port, _DEPENDENCY_PROGRAMMATIC
    _check(api["cuGraphRemoveDependencies_v2"](graph, f2, t2, old, m), "cuGraphRemoveDependencies")
    _check(api["cuGraphAddDependencies_v2"](graph, f2, t2, new, m), "cuGraphAddDependencies")
    return m


def _relax(graph) -> int:
    edges = graph_edges(graph)
    _, to, data = edges
    ours = [d.type == _DEPENDENCY_PROGRAMMATIC and _kernel_of(to[i]) in _LAUNCHED for i, d in enumerate(data)]
    sel = relax_edges([(d.from_port, d.to_port, d.type) for d in data], ours)
    return make_programmatic(graph, edges, sel, _PORT_LAUNCH_ORDER)


class CapturedGraph:
    """An instantiated graph from ``end_capture``; ``launch(stream)`` as CuPy's Graph. ``relaxed``: how many
    edges were rewritten to launch order."""

    def __init__(self, graph: int, exec_: int, relaxed: int):
        self._graph, self._exec, self.relaxed = graph, exec_, relaxed

    def launch(self, stream=None) -> None:
        import cupy

        s = stream if stream is not None else cupy.cuda.get_current_stream()
        _check(_graph_api()["cuGraphLaunch"](ctypes.c_void_p(self._exec), ctypes.c_void_p(s.ptr)), "cuGraphLaunch")

    def __del__(self):
        try:
            api = _graph_api()
            if self._exec:
                api["cuGraphExecDestroy"](ctypes.c_void_p(self._exec))
            if self._graph:
                api["cuGraphDestroy"](ctypes.c_void_p(self._graph))
        except Exception:  # noqa: BLE001,S110 - at interpreter exit the driver may be gone
            pass
        self._exec = self._graph = 0


def end_capture(stream, launch_order: bool | None = None) -> CapturedGraph:
    """End the capture CuPy's ``stream.begin_capture()`` began; relax its PDL edges to launch order
    (``launch_order``, default LAUNCH_ORDER) and instantiate it."""
    api = _graph_api()
    g = ctypes.c_void_p()
    _check(api["cuStreamEndCapture"](ctypes.c_void_p(stream.ptr), ctypes.byref(g)), "cuStreamEndCapture")
    try:
        relaxed = _relax(g) if (LAUNCH_ORDER if launch_order is None else launch_order) else 0
        ge = ctypes.c_void_p()
        _check(api["cuGraphInstantiateWithFlags"](ctypes.byref(ge), g, 0), "cuGraphInstantiate")
    except Exception:
        api["cuGraphDestroy"](g)
        raise
    return CapturedGraph(int(g.value), int(ge.value), relaxed)

"""The worker process that runs an implementation under test (``run --isolate``, the default).

Parent side: ``WorkerImpl`` starts ``python -m conformance.worker`` in its own
session, loads the implementation there (``--impl`` string, a pickled object, or
the default choice), and calls one Op per case over a pair of pipes (pickle). The
parent enforces each case's deadline itself: when it passes, the worker's process
group is killed (SIGKILL), so a hang inside C code, a GPU kernel that never ends
or a busy loop that holds the GIL is stopped on time. A worker that exits or
dies (``os._exit``, a segfault, a signal, the OOM killer) is reported as an ERROR
of the case it held, with its exit status or signal and the last of its output;
the next case starts a fresh worker (and loads the implementation again).

Worker side: stdin is /dev/null, stdout and stderr go to a log file the parent
reads (what the implementation prints is kept per case in the report, and a
crash's ``faulthandler`` dump with it); SIGINT is ignored (the parent handles
Ctrl-C and stops the worker); ``SystemExit`` and ``KeyboardInterrupt`` raised by
the implementation are its ERROR like any exception. The worker exits when the
parent goes away.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

CUDA_IMPL = "kernels_cu.backend:CudaBackend"
DEFAULT_LOAD_TIMEOUT = 600.0
TAIL = 4000  # characters of a dead worker's output kept in the case's detail trace


def default_impl(specs=None):
    """(implementation, why): the CUDA backend where CuPy and a GPU are present, else the baseline."""
    from conformance.baseline import Float32Baseline
    from conformance.invoke import _one_line, load_impl

    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        return load_impl(CUDA_IMPL), f"no --impl: CuPy and a GPU are present, so {CUDA_IMPL}"
    except Exception as exc:  # noqa: BLE001 - any reason the GPU path is unusable selects the baseline, and is said
        why = _one_line(exc)
        return Float32Baseline(specs), f"no --impl and the CUDA backend is unavailable ({why}), so the float32 baseline"


def _no_cases():
    return []


def _portable(specs):
    """Specs that pickle (the default baseline needs references and outputs, not generators)."""
    if specs is None:
        return None
    try:
        slim = {n: dataclasses.replace(s, generate=_no_cases, force=None) for n, s in specs.items()}
        pickle.dumps(slim)
        return slim
    except Exception:  # noqa: BLE001 - unpicklable references: the worker's registry
        return None


# ----------------------------------------------------------------------------- parent side

def _cause(rc: int | None) -> str:
    if rc is None:
        return "it stopped answering"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        crash = " (a crash in native code)" if -rc in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                                                      signal.SIGFPE, signal.SIGABRT) else ""
        return f"killed by {name}{crash}"
    return f"exit status {rc}"


class WorkerImpl:
    """An implementation running in a worker process; the interface of ``invoke.InProcess``."""

    isolated = True

    def __init__(self, impl=None, specs=None, ops=(), load_timeout: float | None = None):
        from conformance.vectors import InputError

        spec = {"target": None, "pickled": None, "default": impl is None, "specs": _portable(specs),
                "sys_path": list(sys.path), "cwd": os.getcwd()}
        self.target = impl if isinstance(impl, str) else None
        if isinstance(impl, str):
            spec["target"] = impl
        elif impl is not None:
            try:
                spec["pickled"] = pickle.dumps(impl)
            except Exception as exc:  # noqa: BLE001
                raise InputError(f"--impl: the implementation object cannot be sent to a worker process "
                                 f"({type(exc).__name__}: {exc}); pass 'package.module:attribute' or run "
                                 "in-process".splitlines()[0]) from None
        self._spec = spec
        self.load_timeout = load_timeout or DEFAULT_LOAD_TIMEOUT
        fd, self._log = tempfile.mkstemp(prefix="dflash-worker-", suffix=".log")
        os.close(fd)
        self._proc = None
        self._send = self._recv = None
        self.starts = 0
        self.name, self.why, self.info = "", None, {}
        self._lock = threading.Lock()
        self._start()

    # -- process management
    def _start(self):
        import conformance
        from conformance.vectors import InputError

        self.starts += 1
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        env = dict(os.environ)
        root = str(Path(conformance.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("PYTHONFAULTHANDLER", "1")
        with open(self._log, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "conformance.worker", str(to_child_r), str(to_parent_w)],
                    pass_fds=(to_child_r, to_parent_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    cwd=self._spec["cwd"], env=env, start_new_session=True)
            finally:
                os.close(to_child_r)
                os.close(to_parent_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(to_parent_r, writable=False)
        pos = self._log_size()
        what = self._spec["target"] or ("the default implementation" if self._spec["default"] else "the object")
        try:
            self._send.send(("load", self._spec))
            if not self._recv.poll(self.load_timeout):
                self._kill()
                raise InputError(f"--impl: loading {what} in the worker took longer than {self.load_timeout:g} s")
            reply = self._recv.recv()
        except (EOFError, OSError):
            rc = self._reap()
            tail = self._read_log(pos).strip().splitlines()
            last = f"; its last line: {tail[-1][:200]}" if tail else ""
            raise InputError(f"--impl: the worker process died while loading {what} ({_cause(rc)}){last}") from None
        if reply[0] != "loaded":
            self._kill()
            raise InputError(reply[1])
        self.info = reply[1]
        self.name, self.why = self.info["name"], self.info.get("why")

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self._log)
        except OSError:
            return 0

    def _read_log(self, pos: int) -> str:
        try:
            with open(self._log, "rb") as f:
                f.seek(pos)
                data = f.read()
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    def _kill(self):
        proc, self._proc = self._proc, None
        for conn in (self._send, self._recv):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        self._send = self._recv = None
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _reap(self):
        proc = self._proc
        rc = None
        if proc is not None:
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
        self._kill()
        return rc

    # -- the handle interface
    def invoke(self, vec, timeout: float | None):
        from conformance.invoke import Outcome
        from conformance.vectors import InputError

        with self._lock:
            if self._proc is None:
                try:
                    self._start()
                except InputError as exc:
                    return Outcome("error", detail=f"could not start a fresh worker: {exc}")
            pos = self._log_size()
            start = time.monotonic()
            try:
                self._send.send(("call", vec.op, dict(vec.inputs), dict(vec.params), list(vec.outputs)))
                ready = self._recv.poll(timeout)
                if not ready:
                    self._kill()
                    out = self._read_log(pos)
                    return Outcome("error", detail=f"timed out after {timeout:g} s (the worker was killed)",
                                   seconds=time.monotonic() - start, output=out[-TAIL:])
                kind, outcome = self._recv.recv()
            except (EOFError, OSError):
                rc = self._reap()
                out = self._read_log(pos)
                return Outcome("error", detail=f"the implementation ended the worker process ({_cause(rc)})",
                               trace=out[-TAIL:], seconds=time.monotonic() - start, output=out[-TAIL:])
            except Exception as exc:  # noqa: BLE001 - an unpicklable reply and the like
                self._kill()
                return Outcome("error", detail=f"the worker's reply could not be read ({type(exc).__name__}: {exc})"
                               .splitlines()[0], seconds=time.monotonic() - start)
            outcome.output = self._read_log(pos)[-TAIL:]
            return outcome

    def environment(self) -> dict:
        from conformance.vectors import InputError

        with self._lock:
            if self._proc is None:
                try:
                    self._start()
                except InputError as exc:
                    return {"environment_error": str(exc)}
            try:
                self._send.send(("env",))
                if not self._recv.poll(self.load_timeout):
                    self._kill()
                    return {"environment_error": f"environment() took longer than {self.load_timeout:g} s"}
                return self._recv.recv()[1]
            except (EOFError, OSError):
                rc = self._reap()
                return {"environment_error": f"the worker process died in environment() ({_cause(rc)})"}

    def close(self):
        with self._lock:
            if self._proc is not None:
                try:
                    self._send.send(("exit",))
                    self._proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                self._kill()
            try:
                os.unlink(self._log)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._proc is not None:
                self._kill()
            os.unlink(self._log)  # a worker never closed leaves no log behind in the temp directory
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown, or already removed by close()
            pass


# ----------------------------------------------------------------------------- worker side

def _load(spec):
    from conformance.invoke import impl_name, load_impl

    sys.path[:] = list(dict.fromkeys(spec["sys_path"] + sys.path))
    why = None
    if spec["default"]:
        impl, why = default_impl(spec["specs"])
    elif spec["target"]:
        impl = load_impl(spec["target"])
    else:
        impl = pickle.loads(spec["pickled"])
    return impl, {"name": impl_name(impl, spec["target"]), "why": why,
                  "array_module": str(getattr(impl, "array_module", "numpy"))}


def _watch_parent(ppid: int):
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(0)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - the implementation closed it
            pass


def serve(rfd: int, wfd: int) -> int:
    from conformance.invoke import Outcome, _one_line, call_method, jsonable_env
    from conformance.vectors import InputError

    recv, send = Connection(rfd, writable=False), Connection(wfd, readable=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    impl = None
    while True:
        try:
            msg = recv.recv()
        except (EOFError, OSError):
            return 0
        if msg[0] == "load":
            try:
                impl, info = _load(msg[1])
                reply = ("loaded", info)
            except InputError as exc:
                reply = ("bad", str(exc))
            except BaseException as exc:  # noqa: BLE001 - SystemExit in a constructor, an unpicklable object
                reply = ("bad", f"--impl: loading the implementation raised {_one_line(exc)}")
            _flush()
            send.send(reply)
        elif msg[0] == "call":
            _, op, tensors, params, names = msg
            outcome = call_method(impl, op, tensors, params, names, None, catch_interrupt=True)
            _flush()
            try:
                send.send(("result", outcome))
            except Exception as exc:  # noqa: BLE001 - outputs that do not pickle
                send.send(("result", Outcome("error", detail=f"the outputs cannot be sent to the harness "
                                                             f"({_one_line(exc)})", seconds=outcome.seconds)))
        elif msg[0] == "env":
            extra = getattr(impl, "environment", None)
            try:
                env = jsonable_env(extra()) if callable(extra) else {}
            except BaseException as exc:  # noqa: BLE001 - a broken environment() must not lose the results
                env = {"environment_error": _one_line(exc)}
            _flush()
            send.send(("env", env))
        else:
            return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))

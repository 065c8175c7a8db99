"""GPU sampling inside the job: one CSV row per GPU every few seconds, from a daemon thread
that can neither block nor kill the training command it watches.

The job runner starts one `GPUSampler` per node next to the training command and stops it
when the command ends. Readings come from NVML (``pynvml``, from the optional
``nvidia-ml-py`` package) or from ``nvidia-smi``; tests inject a backend instead. The CSV is
flushed after every sample, so a crash keeps what was measured. Whatever the sampler has to
say (no GPU on this node, sampling errors) goes, one line at a time, to ``<csv>.note`` and
to stderr. Reports read the CSV back with `read_samples` and `peak_memory_by_gpu`.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, Callable

# One row per GPU per sample. Units are in the names; an empty cell is "not reported".
COLUMNS = ("time_utc", "monotonic_s", "node_rank", "gpu", "name", "memory_used_bytes",
           "memory_total_bytes", "utilization_pct", "power_w", "temperature_c")
# What a backend returns for each GPU: the per-GPU part of a row.
READING_KEYS = COLUMNS[3:]

BACKENDS = ("auto", "nvml", "smi")
SMI_FIELDS = ("index", "name", "memory.used", "memory.total", "utilization.gpu", "power.draw",
              "temperature.gpu")
SMI_ARGS = (f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits")
SMI_TIMEOUT_S = 10.0  # a wedged driver can hang nvidia-smi; give up on that sample, not the job
MIB = 1024 ** 2  # nvidia-smi's memory.used/memory.total are MiB ("nounits" drops the "MiB")
ERROR_LOG_INTERVAL_S = 60.0  # sampling errors are counted always, reported at most this often
# How nvidia-smi writes a value the GPU does not report.
_NOT_REPORTED = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}

Reading = dict[str, Any]
Backend = Callable[[], list[Reading]]


# --- pure parsing -------------------------------------------------------------------------------

def parse_smi_csv(text: str) -> list[Reading]:
    """Readings from the output of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``.

    Memory becomes bytes; values the GPU does not report (``[N/A]``, ``[Not Supported]``)
    become None. A line with the wrong number of fields raises ValueError.
    """
    out = []
    for fields in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not fields or not "".join(fields).strip():
            continue
        if len(fields) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi line has {len(fields)} fields, expected {len(SMI_FIELDS)} "
                             f"({', '.join(SMI_FIELDS)}): {', '.join(fields)!r}")
        index, name, used, total, util, power, temp = (f.strip() for f in fields)
        out.append({
            "gpu": int(index),
            "name": name,
            "memory_used_bytes": _mib_to_bytes(used),
            "memory_total_bytes": _mib_to_bytes(total),
            "utilization_pct": _number(util),
            "power_w": _number(power),
            "temperature_c": _number(temp),
        })
    return out


def read_nvml(nvml: Any) -> list[Reading]:
    """Readings from an initialised NVML module (``pynvml``), one per GPU.

    Memory, name and count are required (an NVML error there is a failed sample);
    utilisation, power and temperature are None on GPUs that do not support them.
    """
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):  # pynvml before 11.5 returns bytes
            name = name.decode(errors="replace")
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = _nvml_optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _nvml_optional(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        temp = _nvml_optional(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        out.append({
            "gpu": i,
            "name": name,
            "memory_used_bytes": int(memory.used),
            "memory_total_bytes": int(memory.total),
            "utilization_pct": None if util is None else float(util.gpu),
            "power_w": None if power_mw is None else power_mw / 1000.0,  # NVML reports milliwatts
            "temperature_c": None if temp is None else float(temp),
        })
    return out


def sample_rows(readings: list[Reading], node_rank: int, time_utc: str, monotonic_s: float) -> list[list]:
    """The CSV rows for one sample: one per GPU, in COLUMNS order, None as an empty cell."""
    rows = []
    for r in readings:
        cells = [time_utc, f"{monotonic_s:.3f}", node_rank, *(r.get(k) for k in READING_KEYS)]
        rows.append(["" if c is None else c for c in cells])
    return rows


@dataclass(frozen=True)
class GPUSample:
    """One row of a sampler CSV."""

    time_utc: str
    monotonic_s: float
    node_rank: int
    gpu: int
    name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_pct: float | None
    power_w: float | None
    temperature_c: float | None


def parse_samples(text: str) -> list[GPUSample]:
    """The samples in a sampler CSV's text. Header rows and rows that do not parse (the last
    line of a file cut short by a crash) are skipped."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(COLUMNS) or tuple(row) == COLUMNS:
            continue
        try:
            out.append(GPUSample(
                time_utc=row[0], monotonic_s=float(row[1]), node_rank=int(row[2]), gpu=int(row[3]),
                name=row[4], memory_used_bytes=_int_or_none(row[5]), memory_total_bytes=_int_or_none(row[6]),
                utilization_pct=_float_or_none(row[7]), power_w=_float_or_none(row[8]),
                temperature_c=_float_or_none(row[9]),
            ))
        except ValueError:
            continue
    return out


def read_samples(csv_path: str | Path) -> list[GPUSample]:
    """The samples in a sampler CSV; [] when the file does not exist (a node without GPUs)."""
    try:
        text = Path(csv_path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return parse_samples(text)


def peak_memory_by_gpu(csv_path: str | Path) -> dict[int, int]:
    """The highest memory_used_bytes seen on each GPU of one node's CSV: {gpu index: bytes}."""
    peaks: dict[int, int] = {}
    for s in read_samples(csv_path):
        if s.memory_used_bytes is not None:
            peaks[s.gpu] = max(peaks.get(s.gpu, 0), s.memory_used_bytes)
    return peaks


# --- backends -----------------------------------------------------------------------------------

def run_smi(executable: str = "nvidia-smi", timeout_s: float = SMI_TIMEOUT_S) -> list[Reading]:
    """One nvidia-smi query (argv list, no shell, with a timeout), parsed."""
    proc = subprocess.run([executable, *SMI_ARGS], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"nvidia-smi exited with code {proc.returncode}: {said}")
    return parse_smi_csv(proc.stdout)


def open_backend(backend: str | Backend) -> tuple[Backend | None, str, Callable[[], None] | None]:
    """(read, description, close) for a backend name or callable; read is None when this node
    has no GPU the backend can see, and the description then says why.

    "auto" is NVML when pynvml imports and nvmlInit works, else nvidia-smi when it is on PATH.
    Both are probed once here, so a node without GPUs is found out before the first sample.
    """
    if callable(backend):
        return backend, "injected", None
    reasons = []
    if backend in ("auto", "nvml"):
        read, why, close = _open_nvml()
        if read is not None:
            return read, why, close
        reasons.append(why)
    if backend in ("auto", "smi"):
        read, why = _open_smi()
        if read is not None:
            return read, why, None
        reasons.append(why)
    return None, "; ".join(reasons), None


def _open_nvml():
    try:
        import pynvml  # optional: pip install nvidia-ml-py
    except ImportError:
        return None, "no NVML (pynvml is not installed)", None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"no NVML (nvmlInit failed: {e})", None
    close = _quietly(pynvml.nvmlShutdown)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:
        close()
        return None, f"no NVML (nvmlDeviceGetCount failed: {e})", None
    if count == 0:
        close()
        return None, "NVML sees no GPU", None
    return partial(read_nvml, pynvml), "nvml", close


def _open_smi():
    path = shutil.which("nvidia-smi")
    if path is None:
        return None, "no nvidia-smi on PATH"
    read = partial(run_smi, path)
    try:
        if not read():
            return None, f"{path} lists no GPU"
    except Exception as e:  # "No devices were found", a timeout
        return None, f"{path} failed: {e}"
    return read, "smi"


# --- the sampler --------------------------------------------------------------------------------

class GPUSampler:
    """Samples every GPU of this node into `csv_path` every `interval_s` seconds.

    `start()` runs it on a daemon thread; `stop()` asks it to end and waits at most
    `timeout_s`. Nothing here raises into the caller once constructed: a node without GPUs
    writes one line to ``<csv_path>.note`` and the thread ends; a failing sample is counted
    in `errors` and reported at most once a minute. Also a context manager.

    `backend` is "auto", "nvml", "smi", or a callable returning one dict per GPU with the
    keys of READING_KEYS (for tests, or another source).
    """

    def __init__(self, csv_path: str | Path, interval_s: float = 5.0, node_rank: int = 0,
                 backend: str | Backend = "auto"):
        if not callable(backend) and backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)} or a callable")
        if not (isinstance(interval_s, (int, float)) and math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.csv_path = Path(csv_path)
        self.note_path = self.csv_path.with_name(self.csv_path.name + ".note")
        self.interval_s = float(interval_s)
        self.node_rank = int(node_rank)
        self.backend = backend
        self.backend_used: str | None = None  # "nvml", "smi", "injected" once the thread has chosen
        self.samples = 0  # samples written (one row per GPU each)
        self.errors = 0  # samples that failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error_note = -math.inf

    def start(self) -> bool:
        """Start sampling on a daemon thread; False (and a note) if no thread could be started."""
        try:
            if self._thread is not None and self._thread.is_alive():
                return True
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-node{self.node_rank}",
                                            daemon=True)  # never keeps the process alive
            self._thread.start()
            return True
        except Exception as e:  # e.g. "can't start new thread" under a tight ulimit
            self._note(f"gpu-sampler: not started: {type(e).__name__}: {e}")
            return False

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Ask the thread to end and wait at most `timeout_s`; True if it has ended. Never raises.

        A backend stuck in the driver is left behind: the thread is a daemon, so it cannot
        hold the process open."""
        try:
            self._stop.set()
            thread = self._thread
            if thread is None:
                return True
            thread.join(timeout_s)
            return not thread.is_alive()
        except Exception:
            return False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "GPUSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    # -- on the thread --

    def _run(self) -> None:
        close = None
        try:
            read, why, close = open_backend(self.backend)
            if read is None:
                self._note(f"gpu-sampler: no GPU found ({why})")
                return
            self.backend_used = why
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.csv_path, "a", newline="") as f:
                writer = csv.writer(f)
                if f.tell() == 0:
                    writer.writerow(COLUMNS)
                    f.flush()
                while not self._stop.is_set():
                    self._sample_once(read, writer, f)
                    self._stop.wait(self.interval_s)
        except Exception as e:  # the CSV cannot be written, or a bug: stop sampling, say why
            self._note(f"gpu-sampler: stopped: {type(e).__name__}: {e}")
        finally:
            if close is not None:
                close()

    def _sample_once(self, read: Backend, writer, f) -> None:
        try:
            readings = read()
            now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            writer.writerows(sample_rows(readings, self.node_rank, now, time.monotonic()))
            f.flush()  # a crash of the job keeps every finished sample
            self.samples += 1
        except Exception as e:  # a driver hiccup, a timeout: count it, say so now and then
            self.errors += 1
            now_s = time.monotonic()
            if now_s - self._last_error_note >= ERROR_LOG_INTERVAL_S:
                self._last_error_note = now_s
                self._note(f"gpu-sampler: sample failed ({self.errors} failed so far; reported at most "
                           f"once every {ERROR_LOG_INTERVAL_S:.0f} s): {type(e).__name__}: {e}")

    def _note(self, line: str) -> None:
        line = line.replace("\n", " ")
        try:
            self.note_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.note_path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass
        try:
            print(line, file=sys.stderr, flush=True)
        except Exception:
            pass


def _quietly(fn: Callable[[], Any]) -> Callable[[], None]:
    def call() -> None:
        try:
            fn()
        except Exception:
            pass
    return call


def _nvml_optional(nvml, fn, *args):
    try:
        return fn(*args)
    except nvml.NVMLError as e:
        if getattr(e, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
            return None
        raise


def _number(text: str) -> float | None:
    if text.strip().lower() in _NOT_REPORTED:
        return None
    return float(text)


def _mib_to_bytes(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(round(value * MIB))


def _int_or_none(text: str) -> int | None:
    return int(text) if text != "" else None


def _float_or_none(text: str) -> float | None:
    return float(text) if text != "" else None

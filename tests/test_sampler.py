"""The GPU sampler: nvidia-smi and NVML parsing, a real (fake) nvidia-smi on PATH, a node
without GPUs, and a backend that hangs or fails — none of which may reach the caller."""

import os
import stat
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from jobctl.runtime.sampler import (
    COLUMNS,
    MIB,
    SMI_ARGS,
    GPUSampler,
    parse_samples,
    parse_smi_csv,
    peak_memory_by_gpu,
    read_nvml,
    read_samples,
)

H100 = "NVIDIA H100 80GB HBM3"


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def sampler_threads(node_rank=0):
    return [t for t in threading.enumerate() if t.name == f"gpu-sampler-node{node_rank}"]


# --- parsing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    # nvidia-smi 550 on an idle H100 SXM
    (f"0, {H100}, 1234, 81559, 0, 71.23, 33",
     {"gpu": 0, "name": H100, "memory_used_bytes": 1234 * MIB, "memory_total_bytes": 81559 * MIB,
      "utilization_pct": 0.0, "power_w": 71.23, "temperature_c": 33.0}),
    # a GPU that reports no power (some consumer and MIG setups)
    ("3, NVIDIA A10G, 22000, 23028, 97, [N/A], 71",
     {"gpu": 3, "name": "NVIDIA A10G", "memory_used_bytes": 22000 * MIB, "memory_total_bytes": 23028 * MIB,
      "utilization_pct": 97.0, "power_w": None, "temperature_c": 71.0}),
    ("1, NVIDIA A100-SXM4-40GB, 0, 40960, [Not Supported], 55.1, [N/A]",
     {"gpu": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_used_bytes": 0, "memory_total_bytes": 40960 * MIB,
      "utilization_pct": None, "power_w": 55.1, "temperature_c": None}),
])
def test_parse_smi_csv(line, expected):
    assert parse_smi_csv(line + "\n") == [expected]


def test_parse_smi_csv_many_gpus_and_blank_lines():
    text = "".join(f"{i}, {H100}, {i * 100}, 81559, {i}, 100.0, 40\n" for i in range(8)) + "\n"
    readings = parse_smi_csv(text)
    assert [r["gpu"] for r in readings] == list(range(8))
    assert readings[7]["memory_used_bytes"] == 700 * MIB


@pytest.mark.parametrize("text", ["0, NVIDIA H100, 1234\n", "No devices were found\n", "x, H100, 1, 2, 3, 4, 5\n"])
def test_parse_smi_csv_rejects_what_is_not_a_query_line(text):
    with pytest.raises(ValueError):
        parse_smi_csv(text)


def fake_nvml(power_supported=True):
    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def power(handle):
        if not power_supported:
            raise NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return 312_456  # mW

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_NOT_SUPPORTED=3, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: H100.encode() if h == 0 else H100,  # bytes in old pynvml
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(h + 1) * 2 ** 30, total=81559 * MIB, free=0),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=88, memory=40),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=lambda h, sensor: 60 + h,
    )


def test_read_nvml():
    readings = read_nvml(fake_nvml())
    assert readings == [
        {"gpu": 0, "name": H100, "memory_used_bytes": 2 ** 30, "memory_total_bytes": 81559 * MIB,
         "utilization_pct": 88.0, "power_w": 312.456, "temperature_c": 60.0},
        {"gpu": 1, "name": H100, "memory_used_bytes": 2 * 2 ** 30, "memory_total_bytes": 81559 * MIB,
         "utilization_pct": 88.0, "power_w": 312.456, "temperature_c": 61.0},
    ]
    assert [r["power_w"] for r in read_nvml(fake_nvml(power_supported=False))] == [None, None]


def test_parse_samples_skips_headers_and_a_line_cut_short():
    header = ",".join(COLUMNS)
    text = (f"{header}\n2026-05-01T10:00:00.000+00:00,12.500,1,0,{H100},1024,2048,50.0,300.5,40.0\n"
            f"2026-05-01T10:00:05.000+00:00,17.500,1,0,{H100},,2048,,,\n"
            f"{header}\n2026-05-01T10:00:10.000+00:00,22.5")
    samples = parse_samples(text)
    assert len(samples) == 2
    assert samples[0].node_rank == 1 and samples[0].memory_used_bytes == 1024 and samples[0].power_w == 300.5
    assert samples[1].memory_used_bytes is None and samples[1].utilization_pct is None


def test_read_samples_of_a_missing_file(tmp_path):
    assert read_samples(tmp_path / "nope.csv") == []
    assert peak_memory_by_gpu(tmp_path / "nope.csv") == {}


@pytest.mark.parametrize("kwargs", [{"backend": "nvidia"}, {"interval_s": 0}, {"interval_s": float("nan")}])
def test_bad_arguments_are_rejected_up_front(tmp_path, kwargs):
    with pytest.raises(ValueError):
        GPUSampler(tmp_path / "gpu.csv", **kwargs)


# --- a real nvidia-smi on PATH (a script) -------------------------------------------------------

def fake_smi(bin_dir, body):
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


@pytest.mark.parametrize("backend", ["smi", "auto"])
def test_samples_from_nvidia_smi_on_path(tmp_path, monkeypatch, no_pynvml, backend):
    counter = tmp_path / "calls"
    # Like nvidia-smi on an H100 node; GPU 0's memory grows by 1000 MiB per call.
    fake_smi(tmp_path / "bin", f"""
[ "$1" = "{SMI_ARGS[0]}" ] && [ "$2" = "{SMI_ARGS[1]}" ] || {{ echo "unexpected arguments: $*" >&2; exit 2; }}
n=$(cat "{counter}" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "{counter}"
echo "0, {H100}, $((1000 * n)), 81559, 0, 71.23, 33"
echo "1, {H100}, 1234, 81559, 100, 698.50, 61"
""")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    csv_path = tmp_path / "gpu" / "node-2.csv"
    sampler = GPUSampler(csv_path, interval_s=0.02, node_rank=2, backend=backend)
    with sampler:
        assert wait_until(lambda: sampler.samples >= 3)
    assert not sampler.running
    assert sampler.backend_used == "smi" and sampler.errors == 0

    lines = csv_path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS)
    assert lines[1].split(",")[2:] == ["2", "0", H100, str(2000 * MIB), str(81559 * MIB), "0.0", "71.23", "33.0"]
    assert lines[2].split(",")[2:] == ["2", "1", H100, str(1234 * MIB), str(81559 * MIB), "100.0", "698.5", "61.0"]
    samples = read_samples(csv_path)
    assert len(samples) == 2 * sampler.samples
    assert {s.node_rank for s in samples} == {2}
    assert samples[0].time_utc.endswith("+00:00") and samples[2].monotonic_s > samples[0].monotonic_s
    calls = int(counter.read_text())  # the probe is one call, each sample one more
    assert peak_memory_by_gpu(csv_path) == {0: 1000 * calls * MIB, 1: 1234 * MIB}
    assert not csv_path.with_name("node-2.csv.note").exists()


def test_nvidia_smi_that_finds_no_devices_means_no_gpu(tmp_path, monkeypatch, no_pynvml):
    fake_smi(tmp_path / "bin", 'echo "No devices were found"\nexit 6\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    sampler = GPUSampler(tmp_path / "gpu.csv", interval_s=0.01, backend="auto")
    sampler.start()
    assert wait_until(lambda: not sampler.running)
    note = (tmp_path / "gpu.csv.note").read_text().splitlines()
    assert len(note) == 1 and "no GPU found" in note[0] and "No devices were found" in note[0]
    assert not (tmp_path / "gpu.csv").exists()


# --- a node without GPUs, a backend that hangs, a backend that fails ----------------------------

def test_no_gpu_writes_one_note_and_the_thread_ends(tmp_path, monkeypatch, no_pynvml):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    csv_path = tmp_path / "gpu" / "node-0.csv"
    sampler = GPUSampler(csv_path, interval_s=0.01)
    assert sampler.start()
    assert wait_until(lambda: not sampler.running)
    assert sampler.stop(timeout_s=0.1)
    note = (tmp_path / "gpu" / "node-0.csv.note").read_text()
    assert note == "gpu-sampler: no GPU found (no NVML (pynvml is not installed); no nvidia-smi on PATH)\n"
    assert not csv_path.exists()
    assert sampler.samples == 0 and sampler.errors == 0


def test_stop_returns_promptly_when_the_backend_hangs(tmp_path):
    entered = threading.Event()

    def hangs():
        entered.set()
        time.sleep(10)
        return []

    sampler = GPUSampler(tmp_path / "gpu.csv", interval_s=0.01, node_rank=7, backend=hangs)
    sampler.start()
    assert entered.wait(2)
    t0 = time.monotonic()
    ended = sampler.stop(timeout_s=0.5)
    assert time.monotonic() - t0 < 5.0  # not the backend's 10 s (a generous bound: shared machines stall)
    assert ended is False and sampler.running
    assert all(t.daemon for t in sampler_threads(7))  # cannot keep the job's process alive


def test_a_failing_backend_is_counted_and_reported_once_a_minute(tmp_path, capsys):
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] <= 20:
            raise RuntimeError("NVML_ERROR_UNKNOWN: driver hiccup")
        return [{"gpu": 0, "name": H100, "memory_used_bytes": 5 * MIB, "memory_total_bytes": 81559 * MIB,
                 "utilization_pct": 12.0, "power_w": 100.0, "temperature_c": 40.0}]

    csv_path = tmp_path / "gpu.csv"
    sampler = GPUSampler(csv_path, interval_s=0.005, backend=flaky)
    sampler.start()
    assert wait_until(lambda: sampler.samples >= 2)
    assert sampler.stop(timeout_s=2.0)
    assert sampler.errors == 20
    note = (tmp_path / "gpu.csv.note").read_text().splitlines()
    assert len(note) == 1
    assert "1 failed so far" in note[0] and "driver hiccup" in note[0]
    assert capsys.readouterr().err.count("driver hiccup") == 1
    assert peak_memory_by_gpu(csv_path) == {0: 5 * MIB}


def test_an_unwritable_csv_stops_sampling_without_raising(tmp_path):
    (tmp_path / "taken").write_text("a file where the folder should be")
    sampler = GPUSampler(tmp_path / "taken" / "gpu.csv", interval_s=0.01, backend=lambda: [])
    sampler.start()
    assert wait_until(lambda: not sampler.running)
    assert sampler.stop() is True


def test_stop_before_start_and_twice(tmp_path):
    sampler = GPUSampler(tmp_path / "gpu.csv", backend=lambda: [])
    assert sampler.stop() is True
    sampler.start()
    assert sampler.stop() is True and sampler.stop() is True

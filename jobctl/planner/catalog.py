"""The GPU catalog: memory, peak dense TFLOP/s and link bandwidths, keyed by name.

Data with query functions (the SkyPilot way). Figures come from vendor datasheets;
entries marked `confirmed=False` carry at least one figure we could not confirm from
a datasheet (the `note` says which). Memory is what the driver reports as the total
(nvidia-smi "MiB"), since that is what the CUDA allocator can draw from, not the
marketing "GB".
"""

from __future__ import annotations

from dataclasses import dataclass

from jobctl.frameworks.base import LOW_PRECISIONS

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    memory_bytes: int  # total device memory as reported by the driver
    bf16_tflops: float | None  # peak dense BF16 tensor TFLOP/s (None: no bf16 support)
    fp16_tflops: float  # peak dense FP16 tensor TFLOP/s (fp32 accumulate)
    mem_bandwidth_gbs: float  # HBM/GDDR bandwidth, GB/s
    intra_node_gbs: float  # GPU-to-GPU bandwidth inside a node, GB/s per direction
    pcie_gbs: float  # host link, GB/s per direction
    inter_node_gbit: float  # typical network per GPU in a cluster of these, Gbit/s
    confirmed: bool = True
    note: str = ""
    is_cpu: bool = False
    fp8_tflops: float | None = None  # peak dense FP8 tensor TFLOP/s (None: no FP8 tensor cores)
    fp4_tflops: float | None = None  # peak dense FP4 (NVFP4/MXFP4) TFLOP/s: Blackwell and later
    nvlink_domain_gpus: int = 0  # GPUs one NVLink domain can span across nodes (GB200 NVL72: 72)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def formats(self) -> tuple[str, ...]:
        """The low-precision training formats its tensor cores run: fp8 (Hopper, Ada, CDNA3),
        and the block-scaled mxfp8 and nvfp4 (Blackwell's fifth-generation tensor cores)."""
        if self.fp4_tflops:
            return ("fp8", "mxfp8", "nvfp4")
        return ("fp8",) if self.fp8_tflops else ()

    def low_precision_tflops(self, precision: str) -> float:
        """The dense peak of a low-precision format: FP8 for fp8 and mxfp8, FP4 for nvfp4."""
        if precision == "nvfp4":
            return self.fp4_tflops or 0.0
        return (self.fp8_tflops or 0.0) if precision in ("fp8", "mxfp8") else 0.0

    def peak_tflops(self, precision: str) -> float:
        """Peak dense tensor throughput for a precision recipe (fp32 runs on TF32 units)."""
        if precision.startswith("bf16") or precision in LOW_PRECISIONS:
            # fp8/mxfp8/nvfp4 GEMMs are timed at the BF16 rate until their efficiency is fitted on
            # measured runs (issue 29): no speed-up is promised that was not measured
            return self.bf16_tflops or self.fp16_tflops
        if precision.startswith("fp16"):
            return self.fp16_tflops
        return self.fp16_tflops / 2  # TF32 tensor cores run at half the 16-bit rate


_CATALOG: dict[str, GPUSpec] = {
    g.key: g
    for g in (
        # H100 SXM5 datasheet: 989 TFLOP/s dense BF16/FP16, 1979 dense FP8, 3.35 TB/s HBM3,
        # NVLink 4 900 GB/s bidirectional; nvidia-smi reports 81559 MiB.
        GPUSpec("h100-sxm-80gb", "NVIDIA H100 SXM 80GB", 81559 * MIB, 989, 989, 3350, 450, 64, 400, fp8_tflops=1979),
        # H100 PCIe datasheet: 756 TFLOP/s dense (1513 FP8), 2.0 TB/s; GPUs talk over PCIe Gen5.
        GPUSpec(
            "h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 81559 * MIB, 756, 756, 2000, 64, 64, 200, fp8_tflops=1513,
            confirmed=False, note="memory total assumed equal to the SXM part",
        ),
        # H200 datasheet: same compute as H100 SXM, 4.8 TB/s; 143771 MiB seen in nvidia-smi.
        GPUSpec("h200-141gb", "NVIDIA H200 141GB", 143771 * MIB, 989, 989, 4800, 450, 64, 400, fp8_tflops=1979),
        # A100 datasheet: 312 TFLOP/s dense BF16/FP16; NVLink 3 600 GB/s bidirectional.
        GPUSpec("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 81920 * MIB, 312, 312, 2039, 300, 32, 200),
        GPUSpec("a100-sxm-40gb", "NVIDIA A100 SXM 40GB", 40960 * MIB, 312, 312, 1555, 300, 32, 200),
        # A10G (AWS g5): no public datasheet; the A10's is 125 TFLOP/s dense BF16 at higher
        # clocks. 23028 MiB is what nvidia-smi shows on g5 instances. g5.12xlarge: 40 Gbit/s.
        GPUSpec(
            "a10g-24gb", "NVIDIA A10G 24GB", 23028 * MIB, 70, 70, 600, 32, 32, 10,
            confirmed=False, note="TFLOP/s estimated (AWS publishes none); A10 datasheet says 125",
        ),
        # L40S datasheet: 362 TFLOP/s dense BF16, 733 dense FP8, 864 GB/s, PCIe Gen4.
        GPUSpec("l40s-48gb", "NVIDIA L40S 48GB", 46068 * MIB, 362, 362, 864, 32, 32, 100, fp8_tflops=733),
        # V100 datasheet: 125 TFLOP/s FP16 tensor, no BF16; NVLink 2 300 GB/s bidirectional.
        GPUSpec(
            "v100-32gb", "NVIDIA V100 SXM2 32GB", 32510 * MIB, None, 125, 900, 150, 16, 100,
            confirmed=False, note="nvidia-smi total taken from user reports",
        ),
        # RTX 4090 (Ada whitepaper): 165 TFLOP/s dense FP16/BF16 and 330 FP8, both with FP32
        # accumulate (what Transformer Engine uses), 1008 GB/s.
        GPUSpec("rtx4090-24gb", "NVIDIA GeForce RTX 4090", 24564 * MIB, 165, 165, 1008, 32, 32, 25, fp8_tflops=330),
        # MI300X datasheet: 1307 TFLOP/s dense BF16, 2615 dense FP8, 5.3 TB/s, 192 GB; Infinity
        # Fabric 7x128 GB/s.
        GPUSpec(
            "mi300x-192gb", "AMD Instinct MI300X", 196288 * MIB, 1307, 1307, 5300, 448, 64, 400, fp8_tflops=2615,
            confirmed=False, note="usable total (rocm-smi) not confirmed",
        ),
        # B200 (HGX B200 datasheet, per GPU, sparse figures halved): 2250 TFLOP/s dense BF16,
        # 4500 FP8/MXFP8, 9000 FP4; 8 TB/s; NVLink 5 1.8 TB/s bidirectional; about 180 GB usable
        # of 192 in HGX systems.
        GPUSpec(
            "b200-192gb", "NVIDIA B200", 183359 * MIB, 2250, 2250, 8000, 900, 64, 400,
            fp8_tflops=4500, fp4_tflops=9000,
            confirmed=False, note="usable total (about 180 GB) not confirmed by a datasheet",
        ),
        # GB200 NVL72 datasheet (72 GPUs; per GPU, sparse figures halved): 2500 TFLOP/s dense
        # BF16, 5000 FP8, 10000 FP4; 186 GB HBM3e at 8 TB/s; NVLink 5 1.8 TB/s bidirectional in
        # one domain of 72 GPUs across 18 compute trays of 4 GPUs. Memory as the driver reports
        # it: nvidia-smi prints "189471MiB" for a GB200 (seen in several public repositories' logs).
        GPUSpec(
            "gb200-186gb", "NVIDIA GB200 (NVL72)", 189471 * MIB, 2500, 2500, 8000, 900, 64, 400,
            fp8_tflops=5000, fp4_tflops=10000, nvlink_domain_gpus=72,
        ),
        # A CPU "device": memory comes from the partition's host RAM (mem_gib).
        GPUSpec(
            "cpu", "CPU (no GPU)", 0, 1.0, 1.0, 20, 10, 10, 10, is_cpu=True,
            note="CPU-only partition: memory is the node's RAM; TFLOP/s is a nominal 1",
        ),
    )
}


def gpu_names() -> list[str]:
    return sorted(_CATALOG)


def lookup_gpu(key: str) -> GPUSpec:
    """Return the catalog entry for `key`; KeyError with close matches if unknown."""
    try:
        return _CATALOG[key]
    except KeyError:
        raise KeyError(unknown_message("GPU", key, gpu_names())) from None


def unknown_message(kind: str, value: str, allowed: list[str]) -> str:
    import difflib  # only for a bad value: not on every plan's import path

    close = difflib.get_close_matches(str(value), allowed, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {kind} {value!r}{hint} (allowed: {', '.join(allowed)})"

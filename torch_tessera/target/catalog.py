"""Datasheet figures of real GPUs, for simulated devices (``sim:<key>``) and for naming the GPUs we detect.

Every figure carries its source: the vendor document's title, the address it is published at, and the date we read it.
Peaks are *dense* (no 2:4 structured sparsity): vendor datasheets print the sparse figure with an asterisk, and we halve
it. Tensor-core peaks are bf16/fp16 inputs with fp32 accumulate; ``peak_fp32`` is the non-tensor fp32 (FMA) peak.

Units: FLOP/s, bytes/s, bytes, and a count of streaming multiprocessors (SMs). Decimal prefixes as vendors use them
(1 TB/s = 1e12 bytes/s, 1 GB of memory = 1e9 bytes). The figures were read on :data:`READ_DATE` from stored copies of
the pages named in :data:`SOURCES`; where NVIDIA publishes no datasheet (H20, A10G, SM counts of some parts) the source
says so and names the secondary source we used.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from torch_tessera.errors import DeviceUnavailableError

READ_DATE = "2026-11-29"

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class Source:
    """Where figures come from.

    Attributes:
        title: the document's title.
        url: the address it is published at (text, not fetched at runtime).
        read: date the figures were read (ISO).
        primary: True for a vendor document, False for a secondary compilation.
    """

    title: str
    url: str
    read: str = READ_DATE
    primary: bool = True


SOURCES: Mapping[str, Source] = {
    "a100-ds": Source("NVIDIA A100 Tensor Core GPU datasheet",
                      "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                      "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "ampere-wp": Source("NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs enabled on A100)",
                        "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
                        "nvidia-ampere-architecture-whitepaper.pdf"),
    "l40s-ds": Source("NVIDIA L40S datasheet", "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    "ada-wp": Source("NVIDIA Ada GPU Architecture whitepaper (SM counts of AD102/AD104 products)",
                     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    "h100-ds": Source("NVIDIA H100 Tensor Core GPU datasheet",
                      "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "hopper-wp": Source("NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs on H100 SXM5)",
                        "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"),
    "h200-ds": Source("NVIDIA H200 Tensor Core GPU datasheet",
                      "https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/"
                      "hpc-datasheet-sc23-h200"),
    "h20-brief": Source("NVIDIA HGX H20 product brief, as reproduced by secondary sources (not published on "
                        "nvidia.com); SM count 78 from a Geekbench listing reported by the press",
                        "https://willitrunai.com/es/gpus/h20-96gb (secondary)", primary=False),
    "rtxpro-ds": Source("NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet",
                        "https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/"),
    "blackwell-rtx-wp": Source("NVIDIA RTX Blackwell GPU Architecture whitepaper (GB202: 188 SMs enabled on RTX PRO "
                               "6000; FP16/BF16 tensor 503.8 TFLOPS dense with FP32 accumulate)",
                               "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
                               "nvidia-rtx-blackwell-gpu-architecture.pdf"),
    "hgx-b200": Source("NVIDIA HGX platform specifications (HGX B200, per GPU)",
                       "https://www.nvidia.com/en-us/data-center/hgx/"),
    "b200-sm": Source("NVIDIA Blackwell architecture technical brief (148 SMs per B200, two dies)",
                      "https://resources.nvidia.com/en-us-blackwell-architecture", primary=True),
    "l4-ds": Source("NVIDIA L4 Tensor Core GPU datasheet", "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"),
    "cuda-guide": Source("NVIDIA CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
                         "(maximum resident threads per SM: 2048 on 8.0/9.0/10.0, 1536 on 8.6/8.9/12.0)",
                         "https://docs.nvidia.com/cuda/cuda-c-programming-guide/#compute-capabilities"),
    "gpu-clocks-sec": Source("Boost clocks and L2 sizes NVIDIA does not print for these boards, as listed by "
                             "TechPowerUp's GPU database (secondary)", "https://www.techpowerup.com/gpu-specs/",
                             primary=False),
    "a10g-sec": Source("Baseten, 'NVIDIA A10 vs A10G for ML model inference' (NVIDIA publishes no A10G datasheet; "
                       "AWS lists 24 GB for G5); SM count 80 from the AWS G5 announcement",
                       "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/", primary=False),
}


@dataclass(frozen=True)
class Figure:
    """One datasheet number.

    Attributes:
        value: the number in SI base units (FLOP/s, bytes/s, bytes, count).
        source: key into :data:`SOURCES`.
        note: how the number was derived from the printed one (e.g. "printed 1,979 with sparsity, halved").
    """

    value: float
    source: str
    note: str = ""


@dataclass(frozen=True)
class KernelFigures:
    """What a roofline over peak FLOP/s and DRAM bandwidth leaves out, per GPU model (used by the cost model).

    Attributes:
        boost_clock_hz: maximum boost clock, Hz (latency-bound kernels scale with it).
        l2_bytes: L2 cache capacity, bytes (working sets that stay in cache).
        peak_fp16_cuda_flops: non-tensor (CUDA-core) fp16/bf16 peak, FLOP/s (elementwise, norm, softmax).
        peak_tf32_flops: dense TF32 tensor-core peak, FLOP/s.
        peak_fp8_flops: dense FP8 tensor-core peak, FLOP/s (0: no FP8 tensor cores).
        max_threads_per_sm: resident threads per SM (occupancy, hence waves of a grid).
    """

    boost_clock_hz: Figure
    l2_bytes: Figure
    peak_fp16_cuda_flops: Figure
    peak_tf32_flops: Figure
    peak_fp8_flops: Figure
    max_threads_per_sm: Figure


#: Special-function results (32-bit exp2, log2, reciprocal, rsqrt, sin, cos) per clock per SM: 16 on every
#: compute capability of the catalog (8.0, 8.6, 8.9, 9.0, 10.0, 12.0), the CUDA C++ Programming Guide's arithmetic
#: instruction throughput table. A softmax spends one of them per score on its exponential.
SFU_PER_CLOCK_PER_SM = Figure(16, "cuda-guide", "exp2 / rsqrt / rcp results per clock per SM, cc 8.0-12.0")

MEGA = 1e6
MB = 1024 * 1024  # L2 sizes are printed in binary megabytes


def _kernel_figures(src: str, clock_mhz: float, l2_mb: float, fp16_cuda_tflops: float, tf32_tflops: float,
                    fp8_tflops: float, threads: int, clock_src: str | None = None, l2_src: str | None = None,
                    notes: tuple[str, ...] = ("", "", "", "", "")) -> KernelFigures:
    return KernelFigures(
        Figure(clock_mhz * MEGA, clock_src or src, notes[0]), Figure(l2_mb * MB, l2_src or src, notes[1]),
        Figure(fp16_cuda_tflops * TERA, src, notes[2]), Figure(tf32_tflops * TERA, src, notes[3]),
        Figure(fp8_tflops * TERA, src, notes[4]), Figure(threads, "cuda-guide"))


@dataclass(frozen=True)
class CatalogEntry:
    """One real GPU model.

    Attributes:
        key: short name used in ``sim:<key>`` strings.
        name: marketing name.
        arch: CUDA architecture, ``sm_XX``.
        peak_bf16_flops: dense bf16/fp16 tensor-core peak, FLOP/s.
        peak_fp32_flops: non-tensor fp32 peak, FLOP/s.
        mem_bandwidth: DRAM bandwidth, bytes/s.
        memory_bytes: DRAM capacity, bytes.
        sm_count: number of SMs enabled.
        interconnect: GPU-to-GPU link family, a key of :data:`torch_tessera.target.links.LINK_FIGURES`
            (``"nvlink3"``, ``"nvlink4"``, ``"nvlink5"``, ``"pcie4"``, ``"pcie5"``).
        peer_access: whether two of these in one host can use CUDA peer copies.
        aliases: other spellings accepted after ``sim:`` and substrings matched in detected GPU names.
        kernel: clocks, L2, CUDA-core and per-dtype tensor rates (:class:`KernelFigures`); ``None``: unknown.
    """

    key: str
    name: str
    arch: str
    peak_bf16_flops: Figure
    peak_fp32_flops: Figure
    mem_bandwidth: Figure
    memory_bytes: Figure
    sm_count: Figure
    interconnect: str
    peer_access: bool = True
    aliases: tuple[str, ...] = ()
    kernel: KernelFigures | None = None

    @property
    def figures(self) -> dict[str, Figure]:
        """Every :class:`Figure` of the entry, by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Figure)}


def _sparse_halved(printed_tflops: float, src: str) -> Figure:
    return Figure(printed_tflops * TERA / 2, src, f"printed {printed_tflops:g} TFLOPS with sparsity, halved")


_ENTRIES = (
    CatalogEntry(
        "a100", "NVIDIA A100 80GB SXM", "sm_80",
        peak_bf16_flops=Figure(312 * TERA, "a100-ds", "BF16 tensor 312 TFLOPS dense (624 with sparsity)"),
        peak_fp32_flops=Figure(19.5 * TERA, "a100-ds"),
        mem_bandwidth=Figure(2039 * GIGA, "a100-ds", "80GB SXM: 2,039 GB/s"),
        memory_bytes=Figure(80 * GIGA, "a100-ds"),
        sm_count=Figure(108, "ampere-wp"),
        interconnect="nvlink3", aliases=("a100-sxm", "a100-80gb", "a100-sxm4-80gb"),
        kernel=_kernel_figures("ampere-wp", 1410, 40, 78, 156, 0, 2048,
                               notes=("", "", "FP16 non-tensor 78 TFLOPS", "TF32 tensor 156 dense (312 sparse)",
                                      "no FP8 tensor cores on sm_80")),
    ),
    CatalogEntry(
        "a100-pcie", "NVIDIA A100 80GB PCIe", "sm_80",
        peak_bf16_flops=Figure(312 * TERA, "a100-ds", "BF16 tensor 312 TFLOPS dense (624 with sparsity)"),
        peak_fp32_flops=Figure(19.5 * TERA, "a100-ds"),
        mem_bandwidth=Figure(1935 * GIGA, "a100-ds", "80GB PCIe: 1,935 GB/s"),
        memory_bytes=Figure(80 * GIGA, "a100-ds"),
        sm_count=Figure(108, "ampere-wp"),
        interconnect="pcie4", aliases=("a100-80gb-pcie",),
        kernel=_kernel_figures("ampere-wp", 1410, 40, 78, 156, 0, 2048,
                               notes=("", "", "FP16 non-tensor 78 TFLOPS", "TF32 tensor 156 dense (312 sparse)",
                                      "no FP8 tensor cores on sm_80")),
    ),
    CatalogEntry(
        "l40s", "NVIDIA L40S", "sm_89",
        peak_bf16_flops=Figure(362.05 * TERA, "l40s-ds", "BF16 tensor 362.05 TFLOPS dense (733 with sparsity)"),
        peak_fp32_flops=Figure(91.6 * TERA, "l40s-ds"),
        mem_bandwidth=Figure(864 * GIGA, "l40s-ds"),
        memory_bytes=Figure(48 * GIGA, "l40s-ds"),
        sm_count=Figure(142, "ada-wp", "142 RT cores = one per SM"),
        interconnect="pcie4", peer_access=False,
        kernel=_kernel_figures("l40s-ds", 2520, 96, 91.6, 183, 733, 1536, l2_src="ada-wp",
                               notes=("boost clock 2,520 MHz", "AD102: 96 MB L2", "Ada runs non-tensor FP16 at the "
                                      "FP32 rate (ada-wp)", "TF32 tensor 183 dense (366 sparse)",
                                      "FP8 tensor 733 dense (1,466 sparse)")),
    ),
    CatalogEntry(
        "h100", "NVIDIA H100 SXM", "sm_90",
        peak_bf16_flops=_sparse_halved(1979, "h100-ds"),
        peak_fp32_flops=Figure(67 * TERA, "h100-ds"),
        mem_bandwidth=Figure(3350 * GIGA, "h100-ds", "3.35 TB/s"),
        memory_bytes=Figure(80 * GIGA, "h100-ds"),
        sm_count=Figure(132, "hopper-wp"),
        interconnect="nvlink4", aliases=("h100-sxm", "h100-80gb-hbm3"),
        kernel=_kernel_figures("hopper-wp", 1980, 50, 133.8, 494.7, 1979, 2048,
                               notes=("H100 SXM5 max boost 1,980 MHz", "50 MB L2", "FP16 non-tensor 133.8 TFLOPS",
                                      "TF32 989.4 sparse, halved", "FP8 3,958 sparse, halved")),
    ),
    CatalogEntry(
        "h200", "NVIDIA H200", "sm_90",
        peak_bf16_flops=_sparse_halved(1979, "h200-ds"),
        peak_fp32_flops=Figure(67 * TERA, "h200-ds"),
        mem_bandwidth=Figure(4800 * GIGA, "h200-ds", "4.8 TB/s"),
        memory_bytes=Figure(141 * GIGA, "h200-ds"),
        sm_count=Figure(132, "hopper-wp", "same GH100 configuration as H100 SXM; 132 also reported by torch on H200"),
        interconnect="nvlink4", aliases=("h200-sxm", "h200-141gb"),
        kernel=_kernel_figures("hopper-wp", 1980, 50, 133.8, 494.7, 1979, 2048,
                               notes=("GH100 as H100 SXM5: 1,980 MHz", "50 MB L2", "FP16 non-tensor 133.8 TFLOPS",
                                      "TF32 989 sparse, halved (h200-ds)", "FP8 3,958 sparse, halved (h200-ds)")),
    ),
    CatalogEntry(
        "h20", "NVIDIA H20", "sm_90",
        peak_bf16_flops=Figure(148 * TERA, "h20-brief", "148 TFLOPS dense (296 with sparsity)"),
        peak_fp32_flops=Figure(44 * TERA, "h20-brief"),
        mem_bandwidth=Figure(4000 * GIGA, "h20-brief", "4.0 TB/s"),
        memory_bytes=Figure(96 * GIGA, "h20-brief"),
        sm_count=Figure(78, "h20-brief"),
        interconnect="nvlink4",
        kernel=_kernel_figures("h20-brief", 1980, 60, 88, 74, 296, 2048, clock_src="gpu-clocks-sec",
                               l2_src="gpu-clocks-sec",
                               notes=("GH100 clock as H100 SXM5 (secondary)", "60 MB L2 (secondary)",
                                      "2x FP32 as on Hopper", "TF32 74 dense", "FP8 296 dense")),
    ),
    CatalogEntry(
        "rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm_120",
        peak_bf16_flops=Figure(503.8 * TERA, "blackwell-rtx-wp",
                               "whitepaper figure for the RTX PRO 6000 (boost clock of the workstation board); "
                               "the server board's clocks may differ slightly"),
        peak_fp32_flops=Figure(120 * TERA, "rtxpro-ds"),
        mem_bandwidth=Figure(1597 * GIGA, "rtxpro-ds", "1,597 GB/s GDDR7"),
        memory_bytes=Figure(96 * GIGA, "rtxpro-ds"),
        sm_count=Figure(188, "blackwell-rtx-wp"),
        interconnect="pcie5", peer_access=False, aliases=("rtx-pro-6000", "rtxpro", "rtx6000pro", "rtx-pro-6000-blackwell"),
        kernel=_kernel_figures("blackwell-rtx-wp", 2617, 128, 120, 126, 1007.6, 1536,
                               notes=("boost clock 2,617 MHz", "GB202: 128 MB L2", "non-tensor FP16 at the FP32 rate",
                                      "TF32 tensor a quarter of FP16", "FP8 tensor twice FP16/BF16")),
    ),
    CatalogEntry(
        "b200", "NVIDIA B200 (HGX)", "sm_100",
        peak_bf16_flops=_sparse_halved(4500, "hgx-b200"),
        peak_fp32_flops=Figure(75 * TERA, "hgx-b200"),
        mem_bandwidth=Figure(7700 * GIGA, "hgx-b200", "7.7 TB/s per GPU on HGX B200"),
        memory_bytes=Figure(180 * GIGA, "hgx-b200"),
        sm_count=Figure(148, "b200-sm"),
        interconnect="nvlink5",
        kernel=_kernel_figures("hgx-b200", 1965, 126, 150, 1100, 4500, 2048, clock_src="gpu-clocks-sec",
                               l2_src="gpu-clocks-sec",
                               notes=("boost clock 1,965 MHz (secondary)", "126 MB L2, two dies (secondary)",
                                      "not printed: 2x FP32 as on Hopper", "TF32 2.2 PF sparse, halved",
                                      "FP8 9 PF sparse, halved")),
    ),
    CatalogEntry(
        "l4", "NVIDIA L4", "sm_89",
        peak_bf16_flops=_sparse_halved(242, "l4-ds"),
        peak_fp32_flops=Figure(30.3 * TERA, "l4-ds"),
        mem_bandwidth=Figure(300 * GIGA, "l4-ds"),
        memory_bytes=Figure(24 * GIGA, "l4-ds"),
        sm_count=Figure(58, "ada-wp", "7,424 CUDA cores / 128 per SM"),
        interconnect="pcie4", peer_access=False,
        kernel=_kernel_figures("l4-ds", 2040, 48, 30.3, 60, 242.5, 1536, l2_src="ada-wp",
                               notes=("boost clock 2,040 MHz", "AD104: 48 MB L2", "non-tensor FP16 at the FP32 rate",
                                      "TF32 120 sparse, halved", "FP8 485 sparse, halved")),
    ),
    CatalogEntry(
        "a10g", "NVIDIA A10G (AWS)", "sm_86",
        peak_bf16_flops=Figure(70 * TERA, "a10g-sec", "tensor FP16/BF16 70 TFLOPS dense as reported"),
        peak_fp32_flops=Figure(35 * TERA, "a10g-sec"),
        mem_bandwidth=Figure(600 * GIGA, "a10g-sec"),
        memory_bytes=Figure(24 * GIGA, "a10g-sec"),
        sm_count=Figure(80, "a10g-sec"),
        interconnect="pcie4", peer_access=False,
        kernel=_kernel_figures("a10g-sec", 1710, 6, 35, 35, 0, 1536, clock_src="gpu-clocks-sec",
                               l2_src="gpu-clocks-sec",
                               notes=("boost clock 1,710 MHz (secondary)", "GA102: 6 MB L2 (secondary)",
                                      "non-tensor FP16 at the FP32 rate on GA10x", "TF32 35 dense as reported",
                                      "no FP8 tensor cores on sm_86")),
    ),
)

CATALOG: Mapping[str, CatalogEntry] = {e.key: e for e in _ENTRIES}


def _norm(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def lookup(name: str) -> CatalogEntry:
    """The catalog entry for a ``sim:`` key or alias (case-insensitive).

    Raises:
        DeviceUnavailableError: the name is not in the catalog; the message lists the keys and the closest match.
    """
    n = _norm(name)
    for e in _ENTRIES:
        if n == e.key or n in e.aliases:
            return e
    import difflib

    keys = sorted(CATALOG)
    close = difflib.get_close_matches(n, keys + [a for e in _ENTRIES for a in e.aliases], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DeviceUnavailableError(f"no simulated device {name!r} in the catalog.{hint} Known: {', '.join(keys)}.")


def match_gpu_name(gpu_name: str) -> CatalogEntry | None:
    """The catalog entry whose model a detected GPU name denotes (``"NVIDIA H200"`` -> h200), or ``None``.

    Longer keys are tried first so that "H200" never matches "H20", and "A100 ... PCIe" picks the PCIe entry.
    """
    n = _norm(gpu_name)
    tokens = set(n.replace("-", " ").split())
    if "pcie" in tokens and "a100" in tokens:
        return CATALOG["a100-pcie"]
    if tokens & {"pcie", "nvl"} and tokens & {"h100", "h200"}:
        return None  # PCIe/NVL boards differ in SMs, clocks and bandwidth from the SXM entries
    if "rtx" in tokens and "6000" in tokens and "blackwell" in tokens:
        return CATALOG["rtxpro6000"]
    for e in sorted(_ENTRIES, key=lambda e: -len(e.key)):
        if e.key in tokens or any(a in tokens for a in e.aliases):
            return e
    return None

"""The GPU table's RTX rows (GeForce and RTX workstation cards), read by ``predict.peaks``.

GeForce "bf16"/"fp16" are the FP32-accumulate tensor rates (what PyTorch runs), half the FP16-accumulate ones, and
"fp8" the FP8 rate with FP32 accumulate, twice those. Where a table gives no decimals, the dense FP32-accumulate
rate is 512 FLOP per SM per clock at the boost clock, the rule that gives the whitepapers' RTX 4090 165.2
(128 SMs, 2.52 GHz), RTX 5090 209.5 (170 SMs, 2.407 GHz) and RTX 3090 71; "tf32" on GeForce cards is their plain
FP32 rate.
A card sold in two memory sizes of one bandwidth (RTX 4060 Ti, 5060 Ti) is matched by its driver name, which
names no size: the row's memory is the larger card's; where the sizes differ in bandwidth (RTX 3060: 12 GB at
360 GB/s, 8 GB at 240) the row requires its size, so the driver name matches none.
"""

from __future__ import annotations

from diffmeter.predict.device_peak import DevicePeak

GPUMAP = "lamonoai/gpumap nvidia/GPU.md (commit 8d5e174), a transcription of NVIDIA's tables"

RTX = (
    DevicePeak(
        "RTX 4090",
        ("rtx", "4090"),
        {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
        "NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 (FP32 accumulate)",
        memory_gb=24,
        bandwidth_gb_s=1008,
    ),
    DevicePeak(
        "RTX 5090",
        ("rtx", "5090"),
        {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5, "fp8": 419.0},
        "NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090 (FP32 accumulate, dense), as third parties "
        "transcribe its tables (the PDF was not readable here); 1,792 GB/s: Tom's Hardware's RTX 5090 vs 4090 table",
        memory_gb=32,
        bandwidth_gb_s=1792,
    ),
    DevicePeak(
        "RTX 5080",
        ("rtx", "5080"),
        {"fp32": 56.28, "bf16": 112.6, "fp16": 112.6, "fp8": 225.1},
        "NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5080 (FP32 accumulate, dense), as third parties "
        "transcribe its Table 4; no TF32 figure found stated; FP32 (non-tensor) 56.28 TFLOPS: fpsbench.com's spec "
        "table (10,752 CUDA cores x 2 x 2,617 MHz boost); 960 GB/s: notebookcheck's spec page",
        memory_gb=16,
        bandwidth_gb_s=960,
    ),
    DevicePeak(
        "RTX 4080",
        ("rtx", "4080"),
        {"fp32": 48.7, "bf16": 97.5, "fp16": 97.5, "fp8": 194.9},
        "NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4080 (FP32 accumulate, dense), as third parties "
        "transcribe it (its own 4080 column was not readable here; no TF32 figure found stated); 716.8 GB/s",
        memory_gb=16,
        bandwidth_gb_s=716.8,
    ),
    DevicePeak(
        "RTX 3090",
        ("rtx", "3090"),
        {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
        "NVIDIA GA102 whitepaper, GeForce RTX 3090 (FP32 accumulate)",
        memory_gb=24,
        bandwidth_gb_s=936,
    ),
    DevicePeak(
        "RTX 3060 12GB",
        ("rtx", "3060", "12gb"),
        {"fp32": 12.7, "tf32": 12.7, "bf16": 25.5, "fp16": 25.5},
        "NVIDIA's RTX 3060 announcement as techtaks.com reports it: 3,584 CUDA cores, 'Boost frequency of 1.78 GHz', "
        "'13 shader-TFLOPs ... 101 tensor-TFLOPs' (sparse, FP16 accumulate; dense FP32 accumulate a quarter: 25.5 = "
        "28 SMs x 512 x 1.777 GHz); pcpartdb.com: 'boost its clock speed up to 1,777 MHz', '192 bit interface. This "
        "gives it a memory bandwidth of 360'",
        memory_gb=12,
        bandwidth_gb_s=360,
    ),
    DevicePeak(
        "RTX 4060 Ti 16GB",
        ("rtx", "4060", "ti"),
        {"fp32": 22.06, "tf32": 22.06, "bf16": 44.1, "fp16": 44.1, "fp8": 88.3},
        "cputronic.com's GeForce RTX 4060 Ti 16 GB page: 'boost clock of 2535MHz', 4352 shading units, 'theoretical "
        "performance of 22.06 TFLOPS'; tensor rates 34 SMs x 512 x 2.535 GHz = 44.1; 288 GB/s: thefpsreview's RTX 4060 "
        "Ti specifications, '128-bit memory bus. This provides 288GB/s'",
        memory_gb=16,
        bandwidth_gb_s=288,
    ),
    DevicePeak(
        "RTX 4070",
        ("rtx", "4070"),
        {"fp32": 29.1, "tf32": 29.1, "bf16": 58.3, "fp16": 58.3, "fp8": 116.6},
        f"{GPUMAP}, GeForce RTX4070 column: 'FP32 (TFLOPS) | 29.1', 'FP16 Tensor Core(TFLOPS)(FP32累计) | 58' (sparse "
        "117; 46 SMs x 512 x 2.475 GHz = 58.3), '内存带宽 | 504', '12GB GDDR6X' (its FP8 column, 233, is the FP16 "
        "accumulate rate)",
        memory_gb=12,
        bandwidth_gb_s=504,
    ),
    DevicePeak(
        "RTX 4070 Ti",
        ("rtx", "4070", "ti"),
        {"fp32": 40.1, "tf32": 40.1, "bf16": 80.2, "fp16": 80.2, "fp8": 160.4},
        f"{GPUMAP}, GeForce RTX4070 Ti column: 'FP32 (TFLOPS) | 40', 'FP16 Tensor Core(TFLOPS)(FP32累计) | 80' (sparse "
        "160; 60 SMs x 512 x 2.61 GHz = 80.2), '内存带宽 | 504', '12GB GDDR6X'",
        memory_gb=12,
        bandwidth_gb_s=504,
    ),
    DevicePeak(
        "RTX 4070 Ti Super",
        ("rtx", "4070", "ti", "super"),
        {"fp32": 44.1, "tf32": 44.1, "bf16": 88.2, "fp16": 88.2, "fp8": 176.4},
        "no NVIDIA table found stored: svethardware.cz, 'RTX 4070 Ti Super ... 8448 CUDA jader', '16GB paměť na "
        "256bitové sběrnici'; the RTX 4070 Ti's 2.61 GHz boost and 21 Gbps GDDR6X (NVIDIA's spec page, not read here): "
        "66 SMs x 512 x 2.61 GHz = 88.2, 8,448 x 2 x 2.61 GHz = 44.1 TFLOPS, 256 bit x 21 Gbps = 672 GB/s",
        memory_gb=16,
        bandwidth_gb_s=672,
    ),
    DevicePeak(
        "RTX 5060 Ti 16GB",
        ("rtx", "5060", "ti"),
        {"fp32": 23.7, "bf16": 47.4, "fp16": 47.4, "fp8": 94.8},
        "cputronic.com's GeForce RTX 5060 Ti 16 GB page: 'Boost Clock 2572 MHz', 4608 shading units, '128bit', GDDR7, "
        "'448.0GB/s'; 36 SMs x 512 x 2.572 GHz = 47.4, 4,608 x 2 x 2.572 GHz = 23.7 TFLOPS; no TF32 figure found "
        "stated",
        memory_gb=16,
        bandwidth_gb_s=448,
    ),
    DevicePeak(
        "RTX 5070",
        ("rtx", "5070"),
        {"fp32": 30.9, "tf32": 30.9, "bf16": 61.7, "fp16": 61.7, "fp8": 123.5},
        f"{GPUMAP}, GeForce RTX5070 column: 'GPU Boost频率(MHZ) | 2,512', 'FP32 (TFLOPS) | 31', 'BFLOAT16 Tensor "
        "Core(TFLOPS) (FP32累计) | 62' (48 SMs x 512 x 2.512 GHz = 61.7), 'FP8 Tensor Core(TFLOPS) | 123', '内存带宽"
        "(GB/s) | 672', '12GB GDDR7'",
        memory_gb=12,
        bandwidth_gb_s=672,
    ),
    DevicePeak(
        "RTX 5070 Ti",
        ("rtx", "5070", "ti"),
        {"fp32": 43.9, "tf32": 43.9, "bf16": 87.9, "fp16": 87.9, "fp8": 175.8},
        f"{GPUMAP}, GeForce RTX5070Ti column: 'GPU Boost频率(MHZ) | 2,452', 'FP32 (TFLOPS) | 44', 'BFLOAT16 Tensor "
        "Core(TFLOPS) (FP32累计) | 88' (70 SMs x 512 x 2.452 GHz = 87.9), 'FP8 Tensor Core(TFLOPS) | 176', '内存带宽"
        "(GB/s) | 896', '16GB GDDR7'",
        memory_gb=16,
        bandwidth_gb_s=896,
    ),
    DevicePeak(
        "RTX 6000 Ada",
        ("rtx", "6000", "ada"),
        {"fp32": 91.1, "tf32": 182.1, "bf16": 364.2, "fp16": 364.2, "fp8": 728.5},
        "NVIDIA RTX 6000 Ada Generation datasheet (dense = half the sparse figure)",
        allows=("generation",),
        memory_gb=48,
        bandwidth_gb_s=960,
    ),
    DevicePeak(
        "RTX A6000",
        ("rtx", "a6000"),
        {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8},
        "NVIDIA RTX A6000 datasheet (dense = half the sparse figure)",
        memory_gb=48,
        bandwidth_gb_s=768,
    ),
)

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="tilegym",
    version="0.1.0",
    description="GPU operators (MLA split-KV decoding first) with Triton, CUDA Tile C++, aiter and PyTorch backends",
    long_description=(Path(__file__).resolve().parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Environment :: GPU :: NVIDIA CUDA",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["tilegym", "tilegym.*"]),
    package_data={
        "tilegym": [
            "ops/tilecpp/*.cuh",
            "ops/tilecpp/**/*.cuh",
            "ops/cutlass/*.cuh",
            "ops/cutlass/**/*.cuh",
            "selection_tables/*.json",
        ]
    },
    python_requires=">=3.10",
    install_requires=["torch>=2.4"],
    extras_require={
        "triton": ["triton>=3.6", "numpy"],
        # The CUDA 13.5 pip toolchain compiles Tile C++ (nvcc >= 13.3 with Tile support).
        "tilecpp": [
            "cuda-bindings>=13.0",
            "nvidia-cuda-nvcc==13.5.37",
            "nvidia-cuda-tileiras==13.5.37",
            "nvidia-cuda-crt",
            "nvidia-cuda-runtime",
            "nvidia-cuda-cccl",
        ],
        # Plain CUDA C++ with CuTe: the CUTLASS headers plus any nvcc >= 12.3 (the pip one here).
        "cutlass": [
            "nvidia-cutlass==4.2.0.0",
            "cuda-bindings>=13.0",
            "nvidia-cuda-nvcc==13.5.37",
            "nvidia-cuda-crt",
            "nvidia-cuda-runtime",
            "nvidia-cuda-cccl",
        ],
        # ROCm only: aiter is built from source on a ROCm machine; this extra only documents it.
        "aiter": [],
        # ruff pinned: its format rules change between releases
        "test": ["pytest>=8", "pytest-xdist", "numpy", "hypothesis>=6", "ruff==0.17.6"],
        "bench": ["matplotlib", "numpy"],
    },
    entry_points={"console_scripts": ["tilegym=tilegym.__main__:main"]},
)

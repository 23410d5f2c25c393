"""Builds the C++/CUDA extension on first import (torch.utils.cpp_extension + ninja) and loads it.

The extension is compiled against whatever torch is installed, so its ABI always matches. CUDA sources are
compiled only when torch is a CUDA build and nvcc is found; otherwise the build is CPU-only and CUDA tensors
get a clear error from the dispatcher. The build directory is keyed by torch version, configuration and
arch list; ninja rebuilds only what changed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

EXTENSION_NAME = "softmax_ops_C"
DEFAULT_CUDA_ARCH = "9.0"  # Hopper: the GPUs this project is tuned on (H100/H200).


def checkout_root(package_dir: Path | None = None) -> Path | None:
    """The source checkout holding the package (csrc/registration.cpp and meta/ beside it), None when the
    package is installed. An installed package's parent is site-packages, where an unrelated top-level
    `meta` or `csrc` package may live: those must never be taken for ours."""
    root = (package_dir or Path(__file__).resolve().parent).parent
    if (root / "csrc" / "registration.cpp").is_file() and (root / "meta" / "__init__.py").is_file():
        return root
    return None


def csrc_dir() -> Path:
    """The folder holding the C++/CUDA sources: the installed `softmax_ops.csrc` package, or `csrc/` beside
    the package when running from a source checkout."""
    checkout = checkout_root()
    if checkout is not None:
        return checkout / "csrc"
    spec = importlib.util.find_spec("softmax_ops.csrc")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("softmax_ops: cannot find the C++ sources (package softmax_ops.csrc is missing)")
    return Path(next(iter(spec.submodule_search_locations)))


def cuda_build_enabled() -> tuple[bool, str]:
    """Whether CUDA sources are compiled, and why (or why not)."""
    forced = os.environ.get("SOFTMAX_OPS_BUILD_CUDA")
    if forced == "0":
        return False, "SOFTMAX_OPS_BUILD_CUDA=0"
    if torch.version.cuda is None:
        return False, "torch is a CPU-only build"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or shutil.which(os.path.join(CUDA_HOME, "bin", "nvcc")) is None:
        return False, "nvcc not found (set CUDA_HOME)"
    return True, f"torch {torch.__version__} with CUDA {torch.version.cuda}, nvcc in {CUDA_HOME}"


def cuda_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST if set, else the visible GPUs' archs, else a small default. Never all archs."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    if torch.cuda.is_available():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in caps)
    return DEFAULT_CUDA_ARCH


def source_files(with_cuda: bool) -> list[Path]:
    """Every source of the extension: the shared host files and CPU kernels always, CUDA files if built."""
    root = csrc_dir()
    sources = [root / "registration.cpp", root / "kernel_registry.cpp", root / "op_checks.cpp"]
    sources += sorted((root / "cpu").glob("*.cpp"))
    if with_cuda:
        for family in ("softmax", "topk"):
            sources += sorted((root / family).glob("*.cu")) + sorted((root / family).glob("*.cpp"))
    return sources


def _pip_cuda_include_dirs() -> list[str]:
    # ATen's CUDA headers include cusparse.h / cublas_v2.h; a toolkit may lack them while torch's pip
    # dependencies ship them under site-packages/nvidia/cu13/include (DESIGN.md §5).
    dirs = []
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for sub in ("nvidia/cu13/include", "nvidia/cu12/include"):
            path = Path(base) / sub
            if path.is_dir():
                dirs.append(str(path))
    return dirs


def _toolkit_root() -> Path | None:
    """The CUDA toolkit nvcc belongs to, when CUDA_HOME itself lacks its headers: torch adds
    CUDA_HOME/include and -L CUDA_HOME/lib*, which are empty when nvcc on the PATH is a wrapper script
    (CUDA_HOME=/usr/local on the CI machine), so the g++-compiled launchers (c10/cuda headers ->
    cuda_runtime.h -> crt/*.h) and the link (-lcudart) need the real toolkit folders."""
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or (Path(CUDA_HOME) / "include" / "cuda_runtime.h").is_file():
        return None
    try:
        dryrun = subprocess.run(
            [os.path.join(CUDA_HOME, "bin", "nvcc"), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in dryrun.stderr.splitlines():
        if line.startswith("#$ TOP="):
            root = Path(line.split("=", 1)[1].strip()).resolve()
            return root if (root / "include" / "cuda_runtime.h").is_file() else None
    return None


def _toolkit_include_and_link_flags() -> tuple[list[str], list[str]]:
    """(include dirs, linker flags) for the toolkit found by _toolkit_root (empty when not needed)."""
    root = _toolkit_root()
    if root is None:
        return [], []
    libs = [f"-L{d}" for d in (root / "lib64", root / "lib") if (d / "libcudart.so").exists()]
    return [str(root / "include")], libs


def _build_directory(with_cuda: bool, arch: str) -> Path:
    config = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}-"
    config += f"cuda{torch.version.cuda}-sm{arch.replace(';', '_').replace('.', '')}" if with_cuda else "cpu"
    cache = Path(os.environ.get("SOFTMAX_OPS_CACHE", Path.home() / ".cache" / "softmax_ops"))
    path = cache / config.replace("+", "_")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fingerprint(sources: list[Path], flags: list[str]) -> str:
    digest = hashlib.sha256("\n".join(flags).encode())
    root = csrc_dir()
    # Every header anywhere under csrc/ counts: ninja rebuilds when one changes, and the user should be told.
    headers = sorted(path for suffix in ("*.h", "*.cuh") for path in root.rglob(suffix))
    for path in [*sources, *headers]:
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def load_extension(verbose: bool | None = None) -> None:
    """Compile (if needed) and load the extension, registering the softmax_ops ops with torch.

    Prints what it compiles and how long it took when a (re)build is needed; a compiler error is raised
    as a RuntimeError carrying the compiler's output.
    """
    from torch.utils.cpp_extension import load

    with_cuda, why = cuda_build_enabled()
    arch = cuda_arch_list() if with_cuda else ""
    sources = source_files(with_cuda)
    cflags = ["-O3"]  # torch adds its own -std (C++17 or C++20 by version)
    if torch.backends.openmp.is_available():
        # at::parallel_for is inlined into the CPU kernels as `#pragma omp parallel`: without -fopenmp they
        # silently run on one thread. The OpenMP runtime is torch's own (libtorch_cpu links libgomp).
        cflags.append("-fopenmp")
    cuda_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    if with_cuda:
        cflags.append("-DSOFTMAX_OPS_WITH_CUDA")
        cuda_flags.append("-DSOFTMAX_OPS_WITH_CUDA")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    build_dir = _build_directory(with_cuda, arch)
    stamp = build_dir / "softmax_ops.fingerprint"
    fingerprint = _fingerprint(sources, cflags + cuda_flags)
    needs_build = not stamp.exists() or stamp.read_text() != fingerprint
    if verbose is None:
        verbose = os.environ.get("SOFTMAX_OPS_VERBOSE_BUILD") == "1"
    if needs_build:
        what = f"CPU + CUDA (arch {arch}; {why})" if with_cuda else f"CPU only ({why})"
        print(f"softmax_ops: compiling {len(sources)} C++/CUDA sources for {what} into {build_dir} ...",
              file=sys.stderr, flush=True)
    toolkit_includes, toolkit_ldflags = _toolkit_include_and_link_flags() if with_cuda else ([], [])
    start = time.perf_counter()
    load(
        name=EXTENSION_NAME,
        sources=[str(s) for s in sources],
        extra_include_paths=[
            str(csrc_dir() / "include"),
            *toolkit_includes,
            *(_pip_cuda_include_dirs() if with_cuda else []),
        ],
        extra_ldflags=toolkit_ldflags,
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_flags,
        build_directory=str(build_dir),
        with_cuda=with_cuda,
        is_python_module=False,
        verbose=verbose,
    )
    if needs_build:
        stamp.write_text(fingerprint)
        print(f"softmax_ops: extension built in {time.perf_counter() - start:.1f} s", file=sys.stderr,
              flush=True)


def import_meta():
    """Import the fake implementations as `softmax_ops.meta`: the installed subpackage, or `meta/` beside the
    package when running from a source checkout (where the build's package-dir mapping does not apply)."""
    import importlib

    root = checkout_root()
    if root is None:
        return importlib.import_module("softmax_ops.meta")
    checkout = root / "meta" / "__init__.py"
    if "softmax_ops.meta" in sys.modules:
        return sys.modules["softmax_ops.meta"]
    spec = importlib.util.spec_from_file_location("softmax_ops.meta", checkout)
    module = importlib.util.module_from_spec(spec)
    sys.modules["softmax_ops.meta"] = module
    spec.loader.exec_module(module)
    return module

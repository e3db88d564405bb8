"""Write a copy of the vLLM 0.26.0 wheel without the files a dense model on Hopper never loads.

    python3 bench/device/vllm_trim.py IN.whl OUT.whl

Left out (sizes compressed in the wheel), each one imported only under a guard or not at all:

- ``vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so`` (129 MB): FlashAttention-2.
  ``flash_attn_interface`` imports it in ``try/except ImportError`` (``FA2_AVAILABLE``), and
  ``fa_utils.get_flash_attn_version`` picks FA3 on compute capability 9.x when
  ``_vllm_fa3_C`` (kept) loads; FA2 is the fallback for ALiBi models and older cards.
- ``vllm/_moe_C_stable_libtorch.abi3.so`` (41 MB): the fused-MoE kernels, imported by
  ``CudaPlatform.import_kernels`` under ``contextlib.suppress(ImportError)``; its fake-op
  registration in ``_custom_ops`` checks ``hasattr(torch.ops, "_moe_C")`` first.
- ``vllm/vllm-rs`` (16 MB): the Rust frontend binary, run only with
  ``VLLM_USE_RUST_FRONTEND=1`` (default off).
- ``vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so``: DeepGEMM built for the other
  Pythons (the GPU image runs 3.12; its 3.12 build is kept).

The wheel's RECORD loses the same lines, so pip installs the copy without complaint.
"""

from __future__ import annotations

import re
import sys
import zipfile

DROP = re.compile(
    r"^vllm/(vllm_flash_attn/_vllm_fa2_C\.abi3\.so"
    r"|_moe_C_stable_libtorch\.abi3\.so"
    r"|vllm-rs"
    r"|third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-x86_64-linux-gnu\.so)$"
)


def trim(src: str, dst: str) -> list[str]:
    """Copy ``src`` to ``dst`` without the files ``DROP`` matches; returns the dropped names."""
    dropped: list[str] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if DROP.match(info.filename):
                dropped.append(info.filename)
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                kept = [ln for ln in lines if not DROP.match(ln.split(",", 1)[0])]
                data = "".join(kept).encode()
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
    return dropped


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_trim.py IN.whl OUT.whl")
    dropped = trim(sys.argv[1], sys.argv[2])
    if not any("_vllm_fa2_C" in name for name in dropped):
        sys.exit(f"{sys.argv[1]}: no FlashAttention-2 kernel found (not the vLLM 0.26.0 wheel?)")
    print("left out:", *dropped, sep="\n  ")


if __name__ == "__main__":
    main()

"""Carrying vLLM to the GPU in pieces: the split, the join and install on the far side (in any
order, a piece twice), the wheel trim, and vllm_check's SKIP where vLLM is missing."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.device import vllm_trim

REPO = Path(__file__).resolve().parents[3]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(path: Path, files: dict[str, bytes], name: str = "vllm", version: str = "0.0.1"):
    """A valid pure-Python wheel holding ``files`` (RECORD lists each with its hash)."""
    info = f"{name}-{version}.dist-info"
    files = files | {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(_record_line(n, d) for n, d in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{info}/RECORD", record)


def sh(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", f"bench/device/{script}", *args], cwd=REPO, capture_output=True, text=True,
        env=os.environ | (env or {}), timeout=300,
    )  # fmt: skip


@pytest.fixture
def pieces(tmp_path: Path) -> tuple[Path, bytes]:
    """A dummy `vllm` wheel with 300 KB of random payload, in pieces of 100 KiB at most."""
    payload = os.urandom(300_000)
    whl = tmp_path / "whl"
    whl.mkdir()
    init = b'__version__ = "0.0.1"\n'
    make_wheel(whl / "vllm-0.0.1-py3-none-any.whl", {"vllm/__init__.py": init,
                                                     "vllm/payload.bin": payload})  # fmt: skip
    proc = sh("vllm_split.sh", str(whl), str(tmp_path / "carry"), env={"PIECE": "100K"})
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "carry", payload


def test_pieces_join_and_install_in_any_order_once(pieces: tuple[Path, bytes], tmp_path: Path):
    carry, payload = pieces
    names = sorted(p.name for p in carry.iterdir())
    assert names == ["piece1", "piece2", "piece3"]
    for d in carry.iterdir():
        assert (d / f"vllm.tar.part{d.name[5:]}").stat().st_size <= 100 * 1024
        assert (d / "manifest").read_text().startswith("pieces=3\n")
    site = tmp_path / "site"
    env = {"SRC": str(carry), "PIECES": str(tmp_path / "got"), "SITE": str(site),
           "PY": sys.executable}  # fmt: skip
    for piece in ["piece3", "piece1", "piece1"]:  # piece1 twice, piece2 not yet
        proc = sh("vllm_setup.sh", piece, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "waiting for the other pieces" in proc.stdout
    assert not site.exists()
    proc = sh("vllm_setup.sh", "piece2", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vllm 0.0.1 from " + str(site) in proc.stdout
    assert (site / "vllm" / "payload.bin").read_bytes() == payload
    again = sh("vllm_setup.sh", "piece2", env=env)
    assert again.returncode == 0 and "already installed" in again.stdout


def test_a_damaged_piece_stops_the_install(pieces: tuple[Path, bytes], tmp_path: Path):
    carry, _ = pieces
    part = carry / "piece2" / "vllm.tar.part2"
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF
    part.write_bytes(bytes(data))
    env = {"SRC": str(carry), "PIECES": str(tmp_path / "got"), "SITE": str(tmp_path / "site"),
           "PY": sys.executable}  # fmt: skip
    for piece in ["piece1", "piece2"]:
        assert sh("vllm_setup.sh", piece, env=env).returncode == 0
    proc = sh("vllm_setup.sh", "piece3", env=env)
    assert proc.returncode == 1
    assert "manifest says" in proc.stdout
    assert not (tmp_path / "site").exists()


def test_trim_leaves_out_the_unloaded_kernels_and_their_record_lines(tmp_path: Path):
    kept = {
        "vllm/__init__.py": b"x = 1\n",
        "vllm/_C_stable_libtorch.abi3.so": b"C",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"dg312",
    }
    dropped = {
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2",
        "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
        "vllm/vllm-rs": b"rs",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"dg311",
    }
    src, dst = tmp_path / "in.whl", tmp_path / "out.whl"
    make_wheel(src, kept | dropped)
    assert sorted(vllm_trim.trim(str(src), str(dst))) == sorted(dropped)
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        record = z.read("vllm-0.0.1.dist-info/RECORD").decode()
        assert all(z.read(n) == d for n, d in kept.items())
    assert set(kept) <= names and not set(dropped) & names
    assert all(n in record for n in kept) and not any(n in record for n in dropped)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_small_check_skips_where_vllm_is_missing(tmp_path: Path):
    proc = sh("vllm_check.sh", env={"SMALL": "1", "PY": sys.executable, "OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SKIP: vLLM is not installed here")
    assert not (tmp_path / "vllm_check.json").exists()

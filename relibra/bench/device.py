"""Parts of scripts/device_check.sh, the prepared check for a GPU machine (one H200, 16 CPU cores).
Nothing in the kit depends on it; it has NOT been run on a GPU yet.

    python -m relibra.bench.device gemm --out DIR [--dry-run]   # (b) expert GEMMs, bf16, fwd + bwd
    python -m relibra.bench.device preset --gemm DIR/expert_gemm.json --out data/device/X_preset.json

(a) the runtime on CUDA at world size 1 with its equivalence check and (c) the CPU gloo runtime at EP8
are plain `torchrun ... -m relibra run --torchrun` and `relibra run` calls in the shell script.

gemm: one SwiGLU routed expert as megatron-core's SequentialMLP runs it
(relibra.bench.gemm.time_expert_forward_backward), bf16, CUDA events, median of repeats, at the
expert shapes of Qwen3-30B-A3B, GLM-4.5-Air and Qwen3-235B-A22B (relibra.cluster presets) over 64 to
65536 tokens. preset: fits relibra.bench.gemm.fit_gemm_efficiency on 3 x forward FLOPs per token to each
shape and writes a cluster preset (the `paper` cluster's links, the fitted matmul_tflops and
gemm_half_tokens of the shape named by --shape), used by naming the file (--cluster FILE.json or
relibra.cluster.read_preset_file).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from relibra.bench.gemm import fit_gemm_efficiency, time_expert_forward_backward
from relibra.cluster import PAPER_MODELS, get_model, get_topology
from relibra.errors import ConfigError
from relibra.paths import write_text

SHAPES = PAPER_MODELS
TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def gemm_curves(device: str = "cuda", tokens=TOKENS, repeats: int = 10, shapes=SHAPES) -> dict:
    """Median bf16 forward + backward seconds of one expert of each shape at each token count."""
    out = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", "dtype": "bfloat16",
           "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "shapes": {}}
    for name in shapes:
        m = get_model(name)
        samples = [time_expert_forward_backward(m.hidden, m.moe_ffn, t, device, "bfloat16", repeats) for t in tokens]
        out["shapes"][name] = {"hidden": m.hidden, "ffn": m.moe_ffn, "tokens": list(tokens),
                               "median_s": [float(np.median(s)) for s in samples],
                               "forward_flops_per_token": 6 * m.hidden * m.moe_ffn}
    return out


def fit_preset(gemm: dict, shape: str, base: str = "paper", name: str | None = None) -> dict:
    """A cluster preset (Topology fields) from gemm_curves output: `base`'s links and sizes, the fitted
    expert rate and half-saturation tokens of `shape` (forward + backward = 3 x forward FLOPs)."""
    if shape not in gemm.get("shapes", {}):
        raise ConfigError(f"--shape {shape!r}: the GEMM file holds {sorted(gemm.get('shapes', {}))}")
    c = gemm["shapes"][shape]
    fit = fit_gemm_efficiency(c["tokens"], c["median_s"], 3 * c["forward_flops_per_token"])
    device = str(gemm.get("device", "gpu")).lower().replace("nvidia ", "").split()[0]
    preset = {**get_topology(base).to_dict(), "name": name or f"{device}-fit",
              "matmul_tflops": fit["matmul_tflops"], "gemm_half_tokens": fit["gemm_half_tokens"]}
    return {"how": f"relibra.bench.device preset: {base} links, expert GEMM fit of {shape} "
                   f"(bf16, forward + backward) measured on {gemm.get('device')} at {gemm.get('when')}",
            "fit": fit, "preset": preset}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m relibra.bench.device")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemm", help="(b) time expert GEMMs on the GPU")
    g.add_argument("--out", required=True)
    g.add_argument("--repeats", type=int, default=10)
    g.add_argument("--dry-run", action="store_true",
                   help="CPU smoke run of the same code (the `tiny` shape, three token counts)")
    f = sub.add_parser("preset", help="fit a cluster preset from `gemm` output")
    f.add_argument("--gemm", required=True)
    f.add_argument("--shape", default="qwen3-30b-a3b", choices=SHAPES)
    f.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "gemm":
        os.makedirs(args.out, exist_ok=True)
        if args.dry_run:
            res = gemm_curves("cpu", tokens=(16, 64, 256), repeats=2, shapes=("tiny",))
        else:
            res = gemm_curves("cuda", repeats=args.repeats)
        path = os.path.join(args.out, "expert_gemm.json")
        write_text(path, json.dumps(res, indent=1))
        print(f"wrote {path}")
        return 0
    with open(args.gemm) as fh:
        gemm = json.load(fh)
    res = fit_preset(gemm, args.shape)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, json.dumps(res, indent=1))  # whole or not at all: a broken preset breaks only its reader
    print(json.dumps(res["fit"]), f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

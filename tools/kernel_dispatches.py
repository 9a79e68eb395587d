"""The dispatches a model would keep with every op a custom kernel, read without a GPU.

A decode step's time beside its kernels goes to the small dispatches IREE forms around them
(norms, cache writes, RoPE where a kernel does not keep it). This writes the model's
substitution spec as a run would with every matmul a Triton kernel at one point (every
attention a flash kernel, a decode step's single-row attention a flash-decoding kernel),
with what the spec writer reads around each op (epilogues, reshapes, copied operands),
rewrites the model with it, lowers it to flow for sm_90 and counts each function's
dispatches by what they compute. No GPU: the kernels are compiled to PTX by Triton.

    python tools/kernel_dispatches.py MODEL.mlirbc [--work DIR] [--fusion]

`--fusion` lowers with IREE's aggressive fusion, the choice a proof may take. Needs the
`triton` extra.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autosched.compile import compiler_path  # noqa: E402
from autosched.config import RunConfig  # noqa: E402
from autosched.drivers.custom_route import model_readings  # noqa: E402
from autosched.drivers.model_stages.prepare import model_for_target  # noqa: E402
from autosched.kernels.flash_attention.family import FLASH  # noqa: E402
from autosched.kernels.flash_decoding.family import DECODING  # noqa: E402
from autosched.model.lowering import analyze_model  # noqa: E402
from autosched.outputs.report import RunLog  # noqa: E402
from autosched.processes import run  # noqa: E402
from autosched.rewrite.apply import RESUME_FLAG, rewrite_model  # noqa: E402
from autosched.rewrite.attention_ops import model_attentions  # noqa: E402
from autosched.rewrite.replacements import substitutable  # noqa: E402
from autosched.rewrite.spec import write_substitution  # noqa: E402
from autosched.targets.cuda import CudaTarget  # noqa: E402
from autosched.targets.host import Machine  # noqa: E402

MATMUL = {"tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3, "group_m": 8}
ATTENTION = {"kernel": FLASH, "q_tile": 64, "kv_tile": 64, "q_warps": 4, "kv_stages": 3}
SINGLE_ROW = {"kernel": DECODING, "q_tile": 16, "kv_tile": 16, "kv_splits": 4, "q_warps": 4}
FUSION = "--iree-dispatch-creation-enable-aggressive-fusion"


def winners(model: str, target: CudaTarget, work: Path) -> list[tuple]:
    """(problem, point) for every op a family can replace."""
    flags = target.compile_flags()
    contractions = analyze_model(model, flags).contractions
    matmuls = {p.name: p for c in contractions if (p := c.as_matmul_problem())}
    chosen = [(p, MATMUL) for p in matmuls.values() if substitutable(p) is None]
    for op in model_attentions(model, flags, str(work / "ops")):
        chosen.append((op, dict(SINGLE_ROW, kv_stages=2) if op.single_row else ATTENTION))
    return chosen


def dispatches(flow: str) -> dict[str, list[str]]:
    """Each public function's dispatches, in order, by the name IREE gives them (without
    its function and number) or the kernel a custom dispatch runs."""
    text = Path(flow).read_text()
    found = {}
    for name in re.findall(r"util\.func public @(\w+)\$async\(", text):
        body = text[text.index(f"@{name}$async(") : text.index(f"@{name}(")]
        calls = re.findall(r"flow\.dispatch @\S+?::@(\S+?)\(", body)
        found[name] = [re.sub(r"^.*?dispatch_\d+_|^.*::@", "", c) for c in calls]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--work", help="a folder for the spec and the lowered models")
    parser.add_argument("--fusion", action="store_true", help="IREE's aggressive fusion")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="kernel_dispatches_"))
    work.mkdir(parents=True, exist_ok=True)
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(args.model, target, str(work / "work"))
    chosen = winners(model, target, work)
    log = RunLog(str(work / "run.log"))
    readings = model_readings((model, str(work)), chosen, target, log)
    unplaced = write_substitution(str(work / "spec.mlir"), chosen, target, *readings)
    flags = target.compile_flags()
    out, replaced = rewrite_model(model, str(work / "spec.mlir"), flags, str(work / "r.mlir"), 900)
    flow = str(work / "flow.mlir")
    extra = [FUSION] if args.fusion else []
    command = [compiler_path(), out, *flags, RESUME_FLAG, *extra, "--compile-to=flow", "-o", flow]
    finished = run(command, 900)
    if finished.returncode != 0:
        sys.exit(f"Error: iree-compile failed on {out}")
    print(f"{args.model}: {replaced} ops replaced by kernels ({len(unplaced)} not placed)")
    for name, calls in dispatches(flow).items():
        print(f"{name}: {len(calls)} dispatches")
        for what, count in collections.Counter(calls).most_common():
            print(f"  {count:4d}  {what}")


if __name__ == "__main__":
    main()

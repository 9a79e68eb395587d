"""The proof of a spec tuned on buckets: the dynamic model as the user gave it, built once
with the spec and once without, run and timed on each bucket's inputs.

Why the dynamic model and not the buckets' module that was tuned: a server runs the dynamic
build, and the spec's matchers leave the lengths free to serve it (model/buckets.py). Each
bucket is proved as a one-function model is (`proof.prove` on its inputs; the builds are
compiled once, in the run's build cache), and the model's verdict is that of one call per
bucket, the rounds' times added (`entry_points.combine`), so a spec is kept only when the
buckets together are faster. The per-bucket lines and the summary's `functions` give the
speedup of each length.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from autosched.drivers.entry_points import combine
from autosched.drivers.proof import ModelProof, prove
from autosched.model.buckets import BucketModel, dynamic_coverage
from autosched.model.configured import tuning_spec_flags
from autosched.model.model_build import build_cache


def bucket_name(model: BucketModel, index: int) -> str:
    """How a bucket's proof is named in the lines and the summary: `main at len16`."""
    return f"{model.function} at {model.buckets[index].label}"


def prove_buckets(
    model: BucketModel,
    flags: Sequence[str],
    spec_path: str | None,
    device: str,
    *,
    work_dir: str,
    spec_flag: str,
    **options,
) -> ModelProof:
    """Each bucket's proof of the dynamic model (in its own folder under `work_dir`, the
    builds from the build cache of the folder above), combined into one."""
    cache = build_cache(os.path.dirname(os.path.abspath(work_dir)))
    proofs = []
    for index, bucket in enumerate(model.buckets):
        proof = prove(
            model.model,
            flags,
            spec_path,
            device,
            spec_flag=spec_flag,
            work_dir=os.path.join(work_dir, bucket.label),
            inputs=bucket.file,
            build_cache=cache,
            **options,
        )
        proof.function = bucket_name(model, index)
        proofs.append(proof)
    combined = combine(proofs)
    combined.function = model.function
    return combined


def bucket_fields(model: BucketModel, flags, spec_path: str | None, spec_flag: str, work: str):
    """The summary's `buckets`: each bucket's file, label and sizes, and how many of the
    dynamic model's dispatches of dynamic size the spec configures (from the proof's
    builds in `work`'s build cache)."""
    configured = total = None
    if spec_path:
        spec = tuning_spec_flags(spec_path, spec_flag)
        configured, total = dynamic_coverage(model, flags, spec, work)
    return {
        "model": model.model,
        "function": model.function,
        "buckets": [
            {"label": b.label, "file": b.file, "sizes": b.sizes, "function": b.function}
            for b in model.buckets
        ],
        "dynamic_dispatches": total,
        "configured_by_spec": configured,
    }

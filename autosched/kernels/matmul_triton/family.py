"""The Triton matmul family behind the kernel contract (kernels/base.py): a point of the CUDA
target's space with `pipeline = Custom`; its warp-specialized Gluon form is the same
family's point with `specialized = 1` (kernels/matmul_gluon/ says why it is a form)."""

from __future__ import annotations

from autosched.kernels.base import Absorbs, KernelFamily
from autosched.kernels.matmul_triton import kernel, space
from autosched.targets.base import Family, Point


class MatmulTriton(KernelFamily):
    name = "matmul_triton"
    kind = "matmul"
    label = "custom kernels"
    selector = ("pipeline", space.CUSTOM)
    knobs = space.CUSTOM_KNOB_SPECS
    absorbs = Absorbs(
        narrow_output=True, epilogues=True, stored_weights=True, reshapes=True, norms=True
    )
    params_type = kernel.KernelParams
    # Its compile and its `hal.dispatch.extern` function (kernel.py).
    compile = staticmethod(kernel.compile_ptx)
    extern_function = staticmethod(kernel.extern_function)

    def unsupported(self, problem) -> str | None:
        return kernel.unsupported(problem)

    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        return space.space(problem, target, pinned)

    def starting_points(self, problem, target) -> list[Point]:
        return space.starting_points(problem, target.sm_count)

    def describe(self, knob_space: dict[str, list]) -> str:
        listed = knob_space.get("pipeline")
        return (
            ", custom Triton matmul kernels searched too (a cfg's `pipeline` list without "
            "Custom leaves them out)"
            if listed is None or space.CUSTOM in listed
            else ", custom matmul kernels left out by the cfg's `pipeline` list"
        )

    def params(self, point: Point) -> kernel.KernelParams:
        return kernel.KernelParams.from_point(point)

    def config_name(self, point: Point) -> str:
        return space.config_name(point)

    def epilogue_form(self, point: Point) -> str:
        """Warp-specialized: its MMA warps run each tile's epilogue before the next tile;
        persistent: one workgroup an SM, the epilogue between its tiles; plain: another
        workgroup on the SM computes through it."""
        if point.get("specialized"):
            return "warp-specialized"
        return "persistent" if point.get("persistent") else "plain"

    def workgroup_size(self, point: Point) -> list[int]:
        return space.workgroup_size(point)

    def shared_memory(self, problem, point: Point, target) -> int:
        return space.shared_memory(problem, point)

    def narrow_params(self, params):
        """The point as it is: a kernel that writes f16 or bf16 (or keeps an epilogue) adds
        its shares of K in an f32 workspace (kernel.uses_workspace)."""
        return params

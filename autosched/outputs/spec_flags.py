"""Flags every iree-compile that applies a tuning spec needs, whatever the target.

With a spec, iree-compile 3.13 can deadlock: dispatches configured on two threads load the
transform library at once (`getOrLoadTransformLibraryModule` under
`MaterializeTuningSpecsPass`, caught with gdb). On this project's 2-core machines about one
compile in 200 hung for good; with one thread none did in 1200. A separate module so that
targets and the spec writer can both import it without importing each other.
"""

SPEC_SAFE_FLAGS = ("--mlir-disable-threading",)

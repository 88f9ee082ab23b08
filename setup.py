"""Builds the optional C++ extension ``fastpipe._C`` (TORCH_LIBRARY ops).

The extension is optional by design: when torch is not importable at build time or the
compiler fails, the package still installs and runs on its Python/Numba fallbacks, and
``fastpipe.ops.EXTENSION_AVAILABLE`` records that. Set ``FASTPIPE_REQUIRE_EXT=1`` to make a
failed build an error (CI does), or ``FASTPIPE_SKIP_EXT=1`` to skip it altogether.
"""
import glob
import os
import sys

from setuptools import setup


def _extension_kwargs() -> dict:
    if os.environ.get("FASTPIPE_SKIP_EXT") == "1":
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        if os.environ.get("FASTPIPE_REQUIRE_EXT") == "1":
            raise
        print("fastpipe: torch is not importable at build time; skipping the C++ extension", file=sys.stderr)
        return {}

    class OptionalBuildExtension(BuildExtension):
        """A compile failure degrades to the fallbacks instead of failing the install."""

        def build_extension(self, ext):  # noqa: D401 - setuptools hook
            try:
                super().build_extension(ext)
            except Exception as exc:  # the compiler's errors vary by toolchain
                if os.environ.get("FASTPIPE_REQUIRE_EXT") == "1":
                    raise
                print(f"fastpipe: C++ extension not built ({exc}); using fallbacks", file=sys.stderr)

    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    extension = CppExtension(
        "fastpipe._C",
        sources,
        extra_compile_args={"cxx": ["-O3"]},
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": OptionalBuildExtension.with_options(use_ninja=False)}}


setup(**_extension_kwargs())

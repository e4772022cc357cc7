"""Run a benchmark script against the old tree in _ab/old (imported first, so sys.modules keeps it)."""
import os, runpy, sys
sys.path.insert(0, os.path.join(os.getcwd(), "_ab", "old"))
import kvpack  # noqa: E402
import kvpack.kernels  # noqa: E402
assert "_ab/old" in kvpack.__file__, kvpack.__file__
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")

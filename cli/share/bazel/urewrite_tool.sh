#!/bin/sh
# The program the urewrite Bazel rules run: `python3 -m urewrite ARGS`, with the urewrite Python
# package installed for the python3 on the action's PATH, or for $UREWRITE_PYTHON when that is
# set (give it with --action_env=UREWRITE_PYTHON=/path/to/python3). Neither is a declared input:
# see docs/bazel.md.
#
# The first argument is the urewrite version the rules belong to. Another installed version
# fails the action, so that outputs cached under one version are never taken for another's.
want="$1"
shift
exec "${UREWRITE_PYTHON:-python3}" -c '
import runpy, sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]  # the working directory (the execroot) is no place to import from
want = sys.argv.pop(1)
try:
    import urewrite
except ImportError as e:
    sys.exit(f"urewrite: {sys.executable} cannot import urewrite ({e}): install it there, "
             "or name another interpreter with --action_env=UREWRITE_PYTHON=...")
if urewrite.__version__ != want:
    sys.exit(f"urewrite: these Bazel rules are for urewrite {want}, but {sys.executable} has "
             f"urewrite {urewrite.__version__}: use the rules of that install (urewrite --bazel-dir)")
sys.argv[0] = "urewrite"
runpy.run_module("urewrite", run_name="__main__", alter_sys=True)
' "$want" "$@"

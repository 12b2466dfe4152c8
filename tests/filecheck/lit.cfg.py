"""lit configuration of tkc's FileCheck tests (see README.md).

`tkc` and `filecheck` are taken from the bin directory of the Python that runs lit, so a fresh venv tests its
own checkout whatever else is on PATH. lit's Output/ directories go to a temporary directory, not the tree.
"""

import os
import shutil
import sys
import tempfile

import lit.formats

config.name = "tkc"  # noqa: F821 (lit defines `config` and `lit_config`)
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.path.join(tempfile.gettempdir(), f"tkc-lit-{os.getuid() if hasattr(os, 'getuid') else 0}")

bin_dir = os.path.dirname(sys.executable)
for tool in ("tkc", "filecheck"):
    if shutil.which(tool, path=bin_dir) is None:
        lit_config.fatal(f"`{tool}` is not in {bin_dir}: install tkc with its test extra, pip install -e '.[test]'")  # noqa: F821
config.environment["PATH"] = os.pathsep.join([bin_dir, config.environment.get("PATH", "")])

repo_root = os.path.dirname(os.path.dirname(config.test_source_root))
config.substitutions.append(("%kernels", os.path.join(repo_root, "tkc", "kernels")))

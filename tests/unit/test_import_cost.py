"""What every command pays at its start: importing the package must not import torch._dynamo (about a second on
these CPUs), which only train.compile needs (it is imported when a step is compiled)."""

import subprocess
import sys

CODE = """
import importlib, sys
from pathlib import Path
import tformer_cli
root = Path(tformer_cli.__file__).parent
for path in sorted(root.rglob("*.py")):  # train/, data/: namespace packages, which pkgutil does not walk
    name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
    importlib.import_module(name)
    if "torch._dynamo" in sys.modules:
        print(name)
        break
else:
    print(f"none of {len(list(root.rglob('*.py')))} modules")
"""


def test_no_module_of_the_package_imports_the_compiler():
    """A fresh interpreter (this one's pytest run may have imported the compiler already)."""
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert result.stdout.strip().startswith("none of"), result.stdout  # else the module that brought it in
    assert int(result.stdout.split()[2]) > 60  # every module was imported

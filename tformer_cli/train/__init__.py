"""Training, through one door: everything outside train/ uses the names below and no module of the folder
(tests/unit/test_import_direction.py).

- `train_recipe`: a recipe's config trained into its run folder, with the checks before and the result after
  (what `tformer train` runs); `Trained` is that result.
- `train`: the loop alone, for a config whose data is already settled.
- `Preempted`: a stop asked for, after its checkpoint.
"""

from tformer_cli.train.loop import Preempted, train
from tformer_cli.train.recipe import Trained, train_recipe

__all__ = ["Preempted", "Trained", "train", "train_recipe"]

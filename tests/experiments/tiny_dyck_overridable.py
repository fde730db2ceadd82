"""tiny_dyck.py with its optional fields typed (experiments/configs/
_options.py), so that a command line can set train.max_steps: the
launcher's runs in test_main.py and test_train.py stop after a step."""

from experiments.configs import _options
from tests.experiments import tiny_dyck


def get_config():
  return _options.overridable(tiny_dyck.get_config())

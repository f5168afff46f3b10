"""Started by every Python process whose ``PYTHONPATH`` holds this folder (see
parity_tests/importable.py): installs the ``TWINS_BLOCK`` import blocker first thing."""
from parity_tests.importable import install_from_env

install_from_env()

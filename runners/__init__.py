"""trustbench runners: everything that executes one run (see ``runners.run``).

Importing ``runners`` or ``runners.algorithms`` must not import torch (``analysis`` relies on it).
"""

__version__ = "0.1.0"

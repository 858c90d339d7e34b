"""The seed API, importable as ``rlpipe.grpo`` (seed 001's recommended names and signatures).

The implementation lives in the ``rl`` layer (``rlpipe.rl.grpo`` and the modules behind it); this
module re-exports it so that course code written against ``rlpipe.grpo`` keeps working.
"""

from rlpipe.rl.grpo import *  # noqa: F403 - the facade re-exports the seed API (names listed in __all__)
from rlpipe.rl.grpo import __all__  # noqa: F401

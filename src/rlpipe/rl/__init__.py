"""GRPO: advantages, losses, KL, the train step, log-probs, records, scoring and replay (the ``rl`` layer).

A regular package (not a namespace one) so that documentation tools find its modules;
``rlpipe.rl.grpo`` is the seed-API facade, re-exported as ``rlpipe.grpo``."""

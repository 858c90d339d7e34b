"""GRPO: advantages, losses, KL, the train step, log-probs, records, scoring and replay (the ``rl`` layer).

A regular package (not a namespace one) so that documentation tools find its modules;
the seed API gathers its public names as ``rlpipe.grpo``."""

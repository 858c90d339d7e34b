"""The generic text task: a user's JSONL dataset, prompt template and reward function (``task.py``),
with the reward named by import path or file path (``reward_ref.py``)."""

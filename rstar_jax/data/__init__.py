"""Data: problem sets, SFT chat sets, a resumable epoch iterator and synthetic tool-needing tasks.

Modules: `problems` (Problem, load_problems, write_jsonl), `sft_data` (ChatExample,
load_sft_jsonl, write_sft_jsonl), `iterator` (EpochIterator), `synthetic_tasks` (make_splits),
`reasoning_gym_source` (optional, needs reasoning-gym==0.1.25), `jsonl` (DataError).
"""

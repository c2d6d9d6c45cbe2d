"""`pipelines.trajectory_ledger`: the step rows, the audit's lost / twice counts, a resume that
drops the rows past its step, and a last line cut by a kill."""

import json

import pytest

from rstar_jax.pipelines import trajectory_ledger as ledger


def _row(step, groups, trained):
  return {"step": step, "groups": [list(g) for g in groups], "trained": [list(t) for t in trained]}


def test_step_row_names_groups_and_trained_samples(monkeypatch):
  monkeypatch.delenv("RSTAR_RESTARTS", raising=False)
  row = ledger.step_row(3, [4, 1], [(6, 111), (7, 222)], [(0, 0), (0, 2), (1, 1)])
  assert row == {
    "step": 3,
    "groups": [[6, 4, 111], [7, 1, 222]],
    "trained": [[0, 0], [0, 2], [1, 1]],
  }
  assert ledger.trajectory_ids([row]) == [(4, 111, 0), (4, 111, 2), (1, 222, 1)]
  monkeypatch.setenv("RSTAR_RESTARTS", "2")
  assert ledger.step_row(1, [0], [(-1, 5)], [])["restarts"] == 2
  with pytest.raises(ValueError, match="2 problems but 1 group ids"):
    ledger.step_row(1, [0, 1], [(0, 5)], [])


def test_audit_counts_lost_twice_and_missing_issue_numbers():
  ref = [_row(1, [(0, 3, 10), (1, 2, 20)], [(0, 0), (0, 1), (1, 0), (1, 1)])]
  ref.append(_row(2, [(2, 0, 30), (3, 1, 40)], [(0, 0), (0, 1), (1, 0), (1, 1)]))
  same_groups_other_steps = [_row(1, ref[1]["groups"], ref[1]["trained"])]
  same_groups_other_steps.append(_row(2, ref[0]["groups"], ref[0]["trained"]))
  ok = ledger.audit(same_groups_other_steps, ref)
  assert ok == {
    "steps": 2,
    "steps_ok": True,
    "groups": 4,
    "trained": 8,
    "groups_taken_twice": 0,
    "trained_twice": 0,
    "seqs_missing": 0,
    "lost_vs_reference": 0,
    "extra_vs_reference": 0,
  }
  # Group 1 trained again in step 2 (a redone step counted twice), group 2 never taken.
  bad = [ref[0], _row(2, [(1, 2, 20), (3, 1, 40)], [(0, 0), (1, 0), (1, 1)])]
  got = ledger.audit(bad, ref)
  assert got["groups_taken_twice"] == 1 and got["trained_twice"] == 1
  assert got["seqs_missing"] == 1 and got["lost_vs_reference"] == 2
  assert not ledger.audit([ref[1]])["steps_ok"]


def test_writer_drops_rows_past_the_resumed_step_and_a_cut_last_line(tmp_path):
  w = ledger.LedgerWriter(tmp_path, None)
  for s in (1, 2, 3):
    w.write(_row(s, [(s, 0, s)], [(0, 0)]))
  w.close()
  path = tmp_path / ledger.FILE
  with open(path, "a") as f:
    f.write('{"step": 4, "groups": [[4, 0')  # the process died inside the write
  assert [r["step"] for r in ledger.read(path)] == [1, 2, 3]
  w = ledger.LedgerWriter(tmp_path, 2)  # resumed at step 2: step 3's update died too
  w.write(_row(3, [(3, 0, 3)], [(0, 0)]))
  w.close()
  assert [r["step"] for r in ledger.read(path)] == [1, 2, 3]
  ledger.LedgerWriter(tmp_path, None).close()  # a fresh run starts empty
  assert ledger.read(path) == []
  path.write_text('not json\n{"step": 1, "groups": [], "trained": []}\n')
  with pytest.raises(ValueError, match="line 1 is not JSON"):
    ledger.read(path)
  json.dumps(ledger.audit([]))  # an empty ledger audits to plain numbers

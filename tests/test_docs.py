"""The docs cannot drift from the code (issue 38 item 2, issue 43).

Fast checks over README.md, docs/*.md and the module READMEs:
  * every relative link points at a file of the repository (and a heading of it, for an
    ``.md#anchor``);
  * every command shown (fenced shell blocks and inline code spans) parses as its program would
    parse it, without running the job: ``python -m launchers.X`` gets the launcher's own absl
    flags, its ``--config`` recipe file and ``:variant`` (the recipe's ``get_config`` refuses an
    unknown variant), ``--config.a.b=v`` overrides of fields the config has, and the typed
    conversion; ``python benchmarks/X.py`` / ``scripts/X.py`` the options its argparse parser
    defines; ``bash scripts/X.sh`` an existing script;
  * every ``--config.a.b`` mentioned anywhere names a field of the schema;
  * docs/configuration.md is what scripts/gen_config_docs.py renders from the schema;
  * the docs site builds with ``mkdocs build --strict``.

  * no two runs of the walked examples share a workdir.

Slow: every example of the README and of docs/newcomer.md run as written, in order, from a
fresh folder (issue 43).
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import unicodedata

import pytest
from absl import flags
from ml_collections import config_flags

from rstar_jax import cli
from rstar_jax.config import from_config_dict, schema

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
README = os.path.join(REPO, "README.md")
MODE = {"train": "rl", "sft": "sft", "eval": "eval", "demo": "rl"}
PYTHONS = ("python", "python3", ".venv/bin/python", "python3.11")


def doc_files() -> list[str]:
  """README.md, docs/*.md and every README.md of the package, third_party and benchmarks."""
  out = [README, *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
  for top in ("rstar_jax", "third_party", "benchmarks", "launchers", "configs", "scripts"):
    out += sorted(glob.glob(os.path.join(REPO, top, "**", "README.md"), recursive=True))
  return out


def _rel(path: str) -> str:
  return os.path.relpath(path, REPO)


FENCE = re.compile(r"^(```|~~~)([\w+-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)


def split_fences(text: str) -> tuple[list[tuple[str, str]], str]:
  """([(language, body)] of the fenced blocks, the text with those blocks blanked out)."""
  blocks = [(m.group(2).lower(), m.group(3)) for m in FENCE.finditer(text)]
  prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
  return blocks, prose


# ----------------------------------------------------------------------------------- links
def heading_anchors(text: str) -> set[str]:
  """The ids a heading gets on GitHub and in the mkdocs site (Python-Markdown's toc slugify);
  both are accepted, since a link works where either does."""
  _, prose = split_fences(text)
  out = set()
  for title in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", prose, re.M):
    plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
    gh = re.sub(r"[^\w\- ]", "", plain.lower(), flags=re.U).replace(" ", "-")
    ascii_ = unicodedata.normalize("NFKD", plain).encode("ascii", "ignore").decode()
    toc = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_).strip().lower())
    out |= {gh, toc}
  return out


def links(text: str) -> list[str]:
  _, prose = split_fences(text)
  prose = re.sub(r"`[^`]*`", "", prose)  # code spans are not links
  found = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)
  found += re.findall(r"^\[[^\]]+\]:\s*(\S+)", prose, re.M)  # reference definitions
  return found


@pytest.mark.parametrize("doc", doc_files(), ids=_rel)
def test_relative_links_point_at_files_and_headings(doc):
  text = open(doc, encoding="utf-8").read()
  bad = []
  for target in links(text):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
      continue
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
    if not full.startswith(REPO) or not os.path.exists(full):
      bad.append(f"{target}: no such file")
      continue
    if anchor and full.endswith(".md"):
      if anchor not in heading_anchors(open(full, encoding="utf-8").read()):
        bad.append(f"{target}: no heading #{anchor} in {_rel(full)}")
  assert not bad, f"{_rel(doc)}: broken links:\n  " + "\n  ".join(bad)


PATH_SPAN = re.compile(
  r"^(?:rstar_jax|configs|launchers|scripts|benchmarks|tests|docs|third_party)/[\w./*-]*$"
)


def code_paths(text: str) -> list[str]:
  """Repository paths named in code spans (``rstar_jax/models/lora.py``, ``benchmarks/results/``,
  ``tests/x.py::test_y``); a glob (``plan_14b_lora_*.json``) must match something."""
  _, prose = split_fences(text)
  out = []
  for span in re.findall(r"(?<!`)`([^`\s]+)`(?!`)", prose):
    path = span.split("::", 1)[0].rstrip(".,;:")
    if PATH_SPAN.match(path):
      out.append(path)
  return out


@pytest.mark.parametrize("doc", doc_files(), ids=_rel)
def test_paths_in_code_spans_exist(doc):
  """A module, script or result file the prose names in backticks is still there (a moved
  module leaves its old path in the docs otherwise)."""
  bad = sorted(
    {
      p
      for p in code_paths(open(doc, encoding="utf-8").read())
      if not glob.glob(os.path.join(REPO, p))
    }
  )
  assert not bad, f"{_rel(doc)}: paths named that do not exist: {bad}"


# -------------------------------------------------------------------------------- commands
COMMAND_START = re.compile(
  r"^(?:[A-Z_]+=\S*\s+)*(?:(?:\.venv/bin/)?python3?\s+(?:-m\s+launchers\.|benchmarks/|scripts/)"
  r"|bash\s+scripts/|scripts/\S+\.sh)"
)


def _shell_lines(body: str) -> list[str]:
  """The simple commands of a shell block: heredoc bodies dropped, continuations joined,
  comments removed, ``&&`` / ``;`` / ``|`` lists split."""
  body = re.sub(r"<<-?'?(\w+)'?\n.*?\n\1\n", "\n", body, flags=re.S)
  body = body.replace("\\\n", " ")
  out = []
  for line in body.splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    try:
      tokens = shlex.split(line, comments=True, posix=True)
    except ValueError:
      continue
    cmd = []
    for t in [*tokens, "&&"]:
      if t in ("&&", "||", ";", "|"):
        if cmd:
          out.append(shlex.join(cmd))
        cmd = []
      else:
        cmd.append(t)
  return out


def commands(text: str) -> list[str]:
  """Every command of a doc that runs one of the repository's programs."""
  blocks, prose = split_fences(text)
  found = []
  for lang, body in blocks:
    if lang in ("bash", "sh", "shell", "console"):
      found += _shell_lines(body)
  for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose):
    found.append(" ".join(span.split()))
  return [c for c in found if COMMAND_START.match(c)]


def _strip_wrappers(args: list[str]) -> list[str]:
  while args and re.fullmatch(r"[A-Z_]+=\S*", args[0]):
    args = args[1:]
  out = []
  for a in args:
    if a in (">", ">>", "2>", "2>&1", "<", "|") or re.match(r"^\d?>", a):
      break
    out.append(a)
  return out


def _flag_defs(path: str) -> dict[str, tuple[str, list | None]]:
  """{flag name: (DEFINE kind, enum values)} of the ``flags.DEFINE_*`` calls in ``path``."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  out = {}
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
      continue
    kind = node.func.attr
    if not kind.startswith("DEFINE_") or not node.args:
      continue
    if not isinstance(node.args[0], ast.Constant):
      continue
    enum = None
    if kind == "DEFINE_enum" and len(node.args) > 2:
      try:
        enum = ast.literal_eval(node.args[2])
      except ValueError:
        enum = None
    out[node.args[0].value] = (kind.removeprefix("DEFINE_"), enum)
  return out


def _argparse_options(path: str) -> set[str]:
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
      out |= {a.value for a in node.args if isinstance(a, ast.Constant)}
  return out | {"-h", "--help"}


def parse_launcher(cmd: str, cwd: str = REPO):
  """(launcher name, absl FlagValues, typed RunConfig or None) of one ``python -m launchers.X``
  command, parsed as the launcher parses it: its own flags and the ones `rstar_jax.cli` adds,
  its ``--config`` recipe with the variant and the ``--config.*`` overrides (list fields as
  `cli.take_list_overrides` takes them), then the typed conversion of the launcher's mode.
  Nothing runs. The conversion is skipped when the command names ``imports`` (modules of the
  user's that the docs only show)."""
  args = _strip_wrappers(shlex.split(cmd))
  assert args[0] in PYTHONS and args[1] == "-m", cmd
  module = args[2].removeprefix("launchers.")
  source = os.path.join(REPO, "launchers", f"{module}.py")
  assert os.path.isfile(source), f"{cmd}: no launcher launchers/{module}.py"
  argv, lists = cli.take_list_overrides([args[2], *args[3:]])
  argv = [a.replace("--config=configs/", f"--config={cwd}/configs/") for a in argv]
  fv = flags.FlagValues()
  defined = {**_flag_defs(os.path.join(REPO, "rstar_jax", "cli.py")), **_flag_defs(source)}
  cfg = None
  if "config" in defined:
    defined.pop("config")
    default = os.path.join(REPO, "configs", "demo.py") if module == "demo" else None
    cfg = config_flags.DEFINE_config_file(
      "config", default, "", flag_values=fv, lock_config=True, sys_argv=argv
    )
  for name, (kind, enum) in defined.items():
    if kind == "enum" and enum:
      flags.DEFINE_enum(name, None, enum, "", flag_values=fv)
    else:
      define = {
        "bool": flags.DEFINE_bool,
        "boolean": flags.DEFINE_bool,
        "integer": flags.DEFINE_integer,
        "float": flags.DEFINE_float,
        "list": flags.DEFINE_list,
        "multi_string": flags.DEFINE_multi_string,
      }.get(kind, flags.DEFINE_string)
      define(name, None, "", flag_values=fv)
  try:
    fv(argv)  # unknown flags, bad values, unknown variants and --config.* fields fail here
  except Exception as e:  # absl, ml_collections and a recipe's UserError alike
    raise AssertionError(f"{cmd}: {type(e).__name__}: {e}") from None
  if cfg is None:
    assert not lists, f"{cmd}: --config.* list overrides on a launcher without --config"
    return module, fv, None
  value = cfg.value
  if lists:
    cli.apply_list_overrides(value, lists)
  if any(re.match(r"--config\.([\w.]+\.)?imports=", a) for a in args):
    return module, fv, None
  try:
    if module in MODE:
      run = cli.typed_config(value, MODE[module], f"launchers.{module}", check_inputs=False)
    else:
      run = from_config_dict(value, check_inputs=False)
  except Exception as e:  # a value the typed config refuses (one line naming the field)
    raise AssertionError(f"{cmd}: {type(e).__name__}: {e}") from None
  return module, fv, run


def check_command(cmd: str) -> None:
  args = _strip_wrappers(shlex.split(cmd))
  placeholder = len(args) > 2 and re.fullmatch(r"launchers\.[A-Z]+", args[2])
  if placeholder or any(a.endswith("...") for a in args):
    return  # an elided example ("launchers.train ...", "launchers.X"), not a command to run
  if args[0] in PYTHONS:
    if args[1] == "-m":
      parse_launcher(cmd)
      return
    script = os.path.join(REPO, args[1])
    assert os.path.isfile(script), f"{cmd}: no such file {args[1]}"
    options = _argparse_options(script)
    given = [a.split("=", 1)[0] for a in args[2:] if a.startswith("-")]
    unknown = [g for g in given if g not in options]
    assert not unknown, f"{cmd}: {args[1]} defines no option {unknown} (it has {sorted(options)})"
    return
  script = args[1] if args[0] == "bash" else args[0]
  assert os.path.isfile(os.path.join(REPO, script)), f"{cmd}: no such script {script}"


@pytest.mark.parametrize("doc", doc_files(), ids=_rel)
def test_every_command_parses(doc):
  found = commands(open(doc, encoding="utf-8").read())
  bad = []
  for cmd in found:
    try:
      check_command(cmd)
    except Exception as e:  # every failure is reported, not the first
      bad.append(f"{cmd}\n    -> {str(e).splitlines()[0] if str(e) else type(e).__name__}")
  assert not bad, f"{_rel(doc)}: commands that no longer parse:\n  " + "\n  ".join(bad)


def _config_paths() -> set[str]:
  out = {"imports", "mode"}

  def walk(prefix: str, cls: type) -> None:
    for f in dataclasses.fields(cls):
      out.add(f"{prefix}.{f.name}")
      for t in (f.type, *getattr(f.type, "__args__", ())):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
          walk(f"{prefix}.{f.name}", t)

  for name, cls in schema.SECTIONS.items():
    walk(name, cls)
  out.add("data.synthetic")
  for f in dataclasses.fields(schema.SyntheticDataConfig):
    out.add(f"data.synthetic.{f.name}")
  return out


@pytest.mark.parametrize("doc", doc_files(), ids=_rel)
def test_every_config_override_names_a_field(doc):
  text = open(doc, encoding="utf-8").read()
  known = _config_paths()
  named = set(re.findall(r"--config\.([a-z_][\w.]*[a-z0-9_])", text))
  bad = sorted(n for n in named if n not in known and not n.startswith("stages"))
  assert not bad, f"{_rel(doc)}: --config.* names no config field: {bad}"


def test_the_command_parser_catches_what_drifts():
  """The checks above fail on a renamed flag, variant or field (each case a real drift)."""
  good = (
    ".venv/bin/python -m launchers.train --config=configs/rstar2_qwen3_14b.py:debug --workdir=w"
  )
  check_command(good)
  for broken in (
    good.replace("--workdir", "--work_dir"),  # a renamed flag
    good.replace(":debug", ":debugg"),  # a renamed variant
    good + " --config.rl.gruop_size=4",  # a misspelt field
    good + " --config.rl.group_size=many",  # a value of the wrong type
    good.replace("launchers.train", "launchers.trian"),  # a renamed launcher
    "python benchmarks/claims.py --out=/tmp/c --seedz=3",  # an argparse option
    "bash scripts/no_such_script.sh",
  ):
    with pytest.raises(AssertionError):
      check_command(broken)
  assert "--config.rl.gruop_size" not in {f"--config.{p}" for p in _config_paths()}
  assert "rl.group_size" in _config_paths() and "data.synthetic.n_train" in _config_paths()


def test_docs_show_the_commands_the_checks_expect():
  """The extraction finds the README's commands (so an empty walk cannot pass silently)."""
  found = commands(open(README, encoding="utf-8").read())
  assert "bash scripts/test.sh" in found
  assert any(c.startswith("bash scripts/setup.sh") for c in found)
  assert sum("-m launchers." in c for c in found) >= 8, found
  assert any("launchers.demo" in c and "--workdir=runs/demo" in c for c in found)


def test_ci_runs_exactly_the_readmes_test_command():
  """`.ci/run` calls the README's test command and nothing else (so a green CI means the
  command a user is told to run passed)."""
  ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
  steps = [
    ln.strip()
    for ln in ci.splitlines()
    if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))
  ]
  text = open(README, encoding="utf-8").read()
  two = text[text.index("## Two commands") : text.index("\n## ", text.index("## Two commands") + 3)]
  shown = [body.strip() for lang, body in split_fences(two)[0] if lang == "bash"]
  assert steps == ["bash scripts/test.sh"] and shown[-1] == "bash scripts/test.sh", (steps, shown)


def test_readme_stays_a_landing_page():
  lines = open(README, encoding="utf-8").read().count("\n")
  assert lines <= 250, f"README.md has {lines} lines; move details to a docs/ page"


# ---------------------------------------------------------------------- generated config page
def test_configuration_page_is_generated_from_the_schema():
  # A fresh process: registrations made by other tests must not reach the rendered page.
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, "scripts", "gen_config_docs.py"), "--check"],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  page = open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8").read()
  for name, cls in schema.SECTIONS.items():
    assert f"## {name} ({cls.__name__})" in page
  doc = dict((n, d) for n, _, d in schema.describe(schema.RLConfig))["group_size"]
  assert "| `group_size` |" in page and doc.replace("|", "\\|") in page


# ------------------------------------------------------------------------------- docs site
def test_docs_site_builds_strict_and_offline(tmp_path):
  """``mkdocs build --strict``: a broken nav entry, a page missing from the nav, a bad
  mkdocstrings reference or a docstring the handler cannot parse is an error. The theme's
  web fonts are off and no plugin fetches anything, so the build needs no network."""
  mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
  if mkdocs is None:
    pytest.skip("mkdocs is not installed (pip install rstar_jax[docs])")
  cfg = open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8").read()
  assert re.search(r"^\s+font:\s*false", cfg, re.M), "mkdocs.yml: theme.font must be false"
  proc = subprocess.run(
    [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=REPO, NO_MKDOCS_2_WARNING="1"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  api = (tmp_path / "site" / "api" / "rl" / "index.html").read_text()
  assert "roc_downsample" in api and "policy_loss" in api  # rendered from the docstrings
  site = tmp_path / "site" / "api"
  assert "rl_step" in (site / "learner" / "index.html").read_text()
  assert "register_verifier" in (site / "rewards" / "index.html").read_text()


# ------------------------------------------------------- the examples, walked as written
# The docs whose examples a user runs in order from a fresh clone (issue 43): the README, the
# newcomer page, then every other docs/ page. Every fenced bash / python block of them is a step
# of the walk unless an HTML comment in the paragraph right above it says
# ``<!-- walk: skip (why) -->`` (a fragment, or a run of hours or of the recipe's GPUs).
WALKED = (
  "README.md",
  "docs/newcomer.md",
  *sorted(
    _rel(p) for p in glob.glob(os.path.join(REPO, "docs", "*.md")) if not p.endswith("newcomer.md")
  ),
)
SKIP_MARK = re.compile(r"<!--\s*walk:\s*skip\s*\(([^)]+)\)\s*-->")
# A python block whose first line names a file ("# my_verifiers.py, next to where you launch")
# is that file, written into the folder, not a script to run.
FILE_HEADER = re.compile(r"\A#\s*([\w.-]+\.py)\b")
HEREDOC = re.compile(r"^[^\n]*<<'EOF'\n(.*?)\nEOF\n", re.M | re.S)
# Commands another test already runs as the docs write them (not rerun here): the command's
# --config value must still appear in that test, so the pairing cannot silently go stale.
COVERED = {
  "configs/demo.py:smoke": "tests/pipelines/test_demo.py",
}


@dataclasses.dataclass(frozen=True)
class Step:
  kind: str  # "cmd", "py" (run as a script), "file" (written), "skip" (a marked block)
  text: str  # the command, the Python source, or the skip reason
  name: str = ""  # the file of a "file" step


def walk_steps(doc: str) -> list[Step]:
  """The steps of ``doc`` (a path relative to the repository) in the order it shows them."""
  text = open(os.path.join(REPO, doc), encoding="utf-8").read()
  out, prev = [], 0
  for m in FENCE.finditer(text):
    lang, body, gap = m.group(2).lower(), m.group(3), text[prev : m.start()]
    prev = m.end()
    if lang not in ("bash", "sh", "shell", "python"):
      continue
    skip = SKIP_MARK.search(gap[gap.rfind("\n\n") :])  # in the paragraph right above
    if skip:
      out.append(Step("skip", skip.group(1), body))
      continue
    if lang == "python":
      header = FILE_HEADER.match(body)
      out.append(Step("file", body, header.group(1)) if header else Step("py", body))
      continue
    pos = 0
    for h in HEREDOC.finditer(body):
      out += [Step("cmd", c) for c in _shell_lines(body[pos : h.start()])]
      out.append(Step("py", h.group(1)))
      pos = h.end()
    out += [Step("cmd", c) for c in _shell_lines(body[pos:])]
  return out


def _flag(args: list[str], name: str) -> str | None:
  return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


def classify(cmd: str) -> str:
  """ "run", or why the walk does not run ``cmd``; an unknown program fails the walk."""
  args = _strip_wrappers(shlex.split(cmd))
  if args[:2] == ["bash", "scripts/setup.sh"]:
    return "set-up: scripts/test.sh ran it before pytest"
  if args[:2] == ["bash", "scripts/test.sh"]:
    return "the test command itself"
  config = _flag(args, "config") or ""
  if config in COVERED:
    covering = open(os.path.join(REPO, COVERED[config]), encoding="utf-8").read()
    assert config in covering, f"{COVERED[config]} no longer runs {config}"
    return f"run by {COVERED[config]}"
  assert args[0] in PYTHONS, (
    f"{cmd}: the walk runs python commands only; mark its block <!-- walk: skip (why) -->"
  )
  return "run"


def _run_dirs(steps: list[Step]) -> list[tuple[str, str]]:
  """(flag, folder) of each run the docs show: --workdir and --out_dir of every command, the
  ones the walk runs, those another test runs and those of skipped blocks alike (a reader runs
  them all in one clone). Each command the walk meets must be one it can run or account for."""
  out = []
  for step in steps:
    if step.kind == "cmd":
      classify(step.text)
      cmds = [step.text]
    elif step.kind == "skip":
      cmds = _shell_lines(step.name)
    else:
      continue
    for cmd in cmds:
      args = _strip_wrappers(shlex.split(cmd))
      out += [(f, os.path.normpath(v)) for f in ("workdir", "out_dir") if (v := _flag(args, f))]
  return out


def test_walked_examples_each_run_in_their_own_folder():
  """No two runs the README and the docs pages show share a workdir (issue 43 row 7: the
  parquet example reused the SFT -> RL chain's ``runs/rl`` and stopped with "phases rl hold
  results of a different run"), and every block is walked or skipped with a reason."""
  steps = [s for doc in WALKED for s in walk_steps(doc)]
  dirs = [d for _, d in _run_dirs(steps)]
  shared = sorted({d for d in dirs if dirs.count(d) > 1})
  assert not shared, f"examples share a run folder (give each its own): {shared}"
  workdirs = [d for f, d in _run_dirs(steps) if f == "workdir"]
  assert len(workdirs) >= 10 and "runs/demo" in workdirs, workdirs
  assert all(s.text.strip() for s in steps if s.kind == "skip")
  kinds = [s.kind for s in steps]
  assert kinds.count("file") >= 1 and kinds.count("py") >= 4 and kinds.count("skip") >= 2, kinds
  # The checker catches the row-7 mistake: two examples with the same --workdir.
  twice = [Step("cmd", "python -m launchers.train --workdir=runs/rl")] * 2
  assert [d for _, d in _run_dirs(twice)] == ["runs/rl", "runs/rl"]


def _resolved(value) -> str:
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, list):
    return ",".join(map(str, value))
  return str(value)


def _check_outputs(folder, args: list[str], cmd: str) -> None:
  """What the next step reads is there, and the settings the command gave took effect."""
  launcher = args[2].removeprefix("launchers.") if args[1] == "-m" else ""
  workdir = _flag(args, "workdir")
  if launcher in ("train", "sft") and workdir:
    mode = "rl" if launcher == "train" else "sft"
    metrics = "metrics.jsonl" if launcher == "train" else "sft_metrics.jsonl"
    assert os.path.isfile(folder / workdir / metrics), f"{cmd}: no {workdir}/{metrics}"
    resolved = json.load(open(folder / workdir / "resolved_config" / f"{mode}.json"))
    for a in args:
      m = re.match(r"--config\.([\w.]+)=(.*)", a)
      if not m or m.group(1) == "model.hf_dir":  # resolved to the directory's own path
        continue
      key, value = m.groups()
      if key.startswith("log."):  # logging settings do not change results: not recorded
        continue
      assert key in resolved, f"{cmd}: {key} is not in {workdir}/resolved_config/{mode}.json"
      got = _resolved(resolved[key])
      assert got.lower() == value.lower(), f"{cmd}: {key} ran as {got!r}"
    if "--config.log.wandb=True" in args:  # offline: the walk sends nothing off this machine
      runs = glob.glob(str(folder / workdir / "wandb" / "offline-run-*"))
      assert runs, f"{cmd}: no offline W&B run under {workdir}/wandb"
  if launcher == "export_hf":
    out_dir = _flag(args, "out_dir")
    assert os.path.isfile(folder / out_dir / "config.json"), f"{cmd}: no {out_dir}/config.json"
  if launcher == "eval":
    report = json.load(open(folder / _flag(args, "out")))
    assert report["metrics"]["num_problems"] >= 1, f"{cmd}: {report}"


def _runnable(doc: str) -> bool:
  return any(
    s.kind in ("py", "file") or (s.kind == "cmd" and classify(s.text) == "run")
    for s in walk_steps(doc)
  )


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in WALKED if _runnable(d)])
def test_doc_examples_run_as_written(doc, tmp_path):
  """A fresh folder holding only the clone's configs/ and launchers/ (the package comes from
  PYTHONPATH, as `.venv`'s editable install gives it): each example of ``doc`` runs in order,
  ``python`` and ``.venv/bin/python`` meaning this interpreter, must exit 0 and leave what the
  next step reads, and a run's ``--config.*`` settings must show in its resolved config. Each
  page gets its own folder: the newcomer page's chain starts from nothing the README built."""
  pytest.importorskip("torch")
  for name in ("configs", "launchers"):
    os.symlink(os.path.join(REPO, name), tmp_path / name)
  env = dict(
    os.environ,
    PYTHONPATH=REPO,
    XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""),
    JAX_PLATFORMS="cpu",
    WANDB_SILENT="true",
    HF_HUB_OFFLINE="1",
  )
  ran, took = [], []
  for step in walk_steps(doc):
    if step.kind == "skip":
      continue
    if step.kind == "file":
      (tmp_path / step.name).write_text(step.text)
      ran.append(step.name)
      continue
    start = time.monotonic()
    if step.kind == "py":
      proc = subprocess.run(
        [sys.executable, "-"], input=step.text, cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
      )  # fmt: skip
      assert proc.returncode == 0, f"{doc}: snippet failed:\n{step.text}\n{proc.stderr[-3000:]}"
      ran.append("py")
      took.append(f"{time.monotonic() - start:6.1f} s  python snippet")
      continue
    if classify(step.text) != "run":
      continue
    args = _strip_wrappers(shlex.split(step.text))
    proc = subprocess.run(
      [sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
      timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"{doc}: {step.text}\n{proc.stderr[-4000:]}"
    _check_outputs(tmp_path, args, step.text)
    ran.append(args[2] if args[1] == "-m" else args[1])
    took.append(f"{time.monotonic() - start:6.1f} s  {step.text[:90]}")
  print(f"{doc}: the walk's steps (-s shows this)", *took, sep="\n  ")
  expected = {
    "README.md": [
      "py", "launchers.train", "launchers.eval", "launchers.export_hf", "py",  # newcomer path
      "py", "my_verifiers.py", "launchers.train", "py", "launchers.train",  # plug-ins
      "launchers.train",  # logging
    ],
    "docs/newcomer.md": [
      "launchers.sft", "launchers.train", "launchers.eval", "launchers.export_hf", "py",
    ],
  }  # fmt: skip
  assert ran == expected.get(doc, ran) and ran, ran

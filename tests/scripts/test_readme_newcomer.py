"""The README's newcomer path stays what a fresh clone can run (issue 29).

Every ``python -m launchers.X`` line of the set-up and newcomer sections is parsed as
that launcher parses it (absl flags it defines, ml_collections ``--config`` file, variant and
overrides, the typed-config conversion), each path a command reads is one an earlier step
writes, and the snippet that builds the ``:debug`` run's local Qwen3 directory runs and makes
what the ``:debug`` command reads. Nothing trains here (the walk itself is in the issue note).
"""

import os
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from rstar_jax import cli
from rstar_jax.config import from_config_dict

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(REPO, "README.md")
SECTIONS = ("## Two commands", "## Newcomer path")
MODE = {"train": "rl", "sft": "sft", "eval": "eval", "demo": "rl"}


def _section(text: str, title: str) -> str:
  start = text.index(title)
  end = text.find("\n## ", start + len(title))
  return text[start : end if end >= 0 else len(text)]


def readme_path() -> list[tuple[str, str]]:
  """The path in README order: ("cmd", a shell command) and ("py", a Python snippet: a
  ``python - <<'EOF'`` heredoc or a ```python block)."""
  text = open(README, encoding="utf-8").read()
  out = []

  def commands(chunk: str):
    for line in chunk.replace("\\\n", " ").splitlines():
      line = line.split("#", 1)[0].strip()
      out.extend(("cmd", c.strip()) for c in line.split("&&") if c.strip())

  for title in SECTIONS:
    for lang, body in re.findall(r"```(bash|python)\n(.*?)```", _section(text, title), re.S):
      if lang == "python":
        out.append(("py", body))
        continue
      pos = 0
      for m in re.finditer(r"^[^\n]*<<'EOF'\n(.*?)\nEOF\n", body, re.M | re.S):
        commands(body[pos : m.start()])
        out.append(("py", m.group(1)))
        pos = m.end()
      commands(body[pos:])
  return out


def _launcher_flags(module: str) -> dict[str, str]:
  """{flag name: DEFINE kind} of a launcher (and the flags `cli` adds to every launcher)."""
  names = {}
  for path in (f"launchers/{module}.py", "rstar_jax/cli.py"):
    src = open(os.path.join(REPO, path), encoding="utf-8").read()
    for kind, name in re.findall(r"flags\.DEFINE_(\w+)\(\s*\"([\w.]+)\"", src):
      names[name] = kind
  return names


def parse_launcher(cmd: str):
  """(launcher name, absl FlagValues, typed RunConfig) of one README command."""
  args = shlex.split(cmd)
  assert args[0] in ("python", ".venv/bin/python") and args[1] == "-m", cmd
  module = args[2].removeprefix("launchers.")
  assert os.path.isfile(os.path.join(REPO, "launchers", f"{module}.py")), cmd
  argv = [args[2], *args[3:]]
  fv = flags.FlagValues()
  defined = _launcher_flags(module)
  defined.pop("config", None)  # config_flags.DEFINE_config_file, defined below
  default = os.path.join(REPO, "configs", "demo.py") if module == "demo" else None
  cfg = config_flags.DEFINE_config_file(
    "config", default, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  for name, kind in defined.items():
    define = {"bool": flags.DEFINE_bool, "list": flags.DEFINE_list}.get(kind, flags.DEFINE_string)
    define(name, None, "", flag_values=fv)
  fv(argv)  # unknown flags and --config.* fields the config lacks fail here
  if module in MODE:
    run = cli.typed_config(cfg.value, MODE[module], f"launchers.{module}", check_inputs=False)
  else:
    run = from_config_dict(cfg.value, check_inputs=False)
  return module, fv, run


def test_readme_newcomer_commands_parse_and_read_what_earlier_steps_write(monkeypatch):
  monkeypatch.chdir(REPO)
  path = readme_path()
  kinds = [k for k, _ in path]
  assert kinds.count("cmd") >= 8 and kinds.count("py") == 2, path
  made = set()
  modules = []
  for kind, text in path:
    if kind == "py":
      reads = re.findall(r"from_pretrained\(\"([^\"]+)\"\)", text)
      assert all(os.path.normpath(r) in made for r in reads), (reads, made)
      made.update(os.path.normpath(m) for m in re.findall(r"^out = \"([^\"]+)\"", text, re.M))
      continue
    if cmd_is_setup(text):
      continue
    module, fv, run = parse_launcher(text)
    modules.append(module)
    reads = [run.model.hf_dir] if run.model.hf_dir else []
    if "checkpoint_dir" in fv and fv["checkpoint_dir"].value:
      reads.append(fv["checkpoint_dir"].value)
    missing = [r for r in reads if os.path.normpath(r) not in made]
    assert not missing, f"{text}: reads {missing}, which no earlier README step writes"
    if "workdir" in fv and fv["workdir"].value:
      w = os.path.normpath(fv["workdir"].value)
      made.update({w, os.path.join(w, "hf"), os.path.join(w, "ckpt")})
    if "out_dir" in fv and fv["out_dir"].value:
      made.add(os.path.normpath(fv["out_dir"].value))
  assert modules.count("demo") == 2 and {"train", "eval", "export_hf"} <= set(modules)


def cmd_is_setup(cmd: str) -> bool:
  if cmd.startswith("bash scripts/"):
    assert os.path.isfile(os.path.join(REPO, cmd.split()[1])), cmd
    return True
  return False


def test_readme_debug_run_reads_the_local_model_dir_the_snippet_builds(tmp_path, monkeypatch):
  pytest.importorskip("torch")
  path = readme_path()
  (snippet,) = [t for k, t in path if k == "py" and "save_pretrained" in t]
  (debug,) = [t for k, t in path if k == "cmd" and ":debug" in t and "launchers.train" in t]
  monkeypatch.chdir(REPO)
  _, _, run = parse_launcher(debug)
  monkeypatch.chdir(tmp_path)
  exec(compile(snippet, "README-model-snippet", "exec"), {})
  mc = run.model.qwen3_config()  # reads <hf_dir>/config.json, relative to the cwd
  assert mc.num_hidden_layers == 2 and mc.vocab_size == 512
  from rstar_jax.pipelines import data_sources

  tok = data_sources.load_tokenizer(run.tokenizer_dir())
  assert tok.convert_tokens_to_ids("<|im_end|>") is not None and len(tok) <= mc.vocab_size

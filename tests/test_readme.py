"""The README's examples say what the code does."""

import re
from pathlib import Path

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_the_python_profile_example_prints_the_number_it_shows():
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "diffmeter.profile(" in b)
    namespace: dict = {}
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if re.fullmatch(r"\d+ \(MACs\)", comment.strip()):
            assert eval(code, namespace) == int(comment.split()[0]), line  # noqa: S307 (our own README)
        elif line and not line.startswith((" ", "for ")):
            exec(line, namespace)  # noqa: S102


def test_every_command_in_the_readme_exists():
    from typer.main import get_command

    from diffmeter.cli import app

    commands = set(get_command(app).commands)
    code = "\n".join(re.findall(r"```(?:bash|console)\n(.*?)```", README, re.S))
    used = set(re.findall(r"^\s*(?:\$ )?diffmeter ([a-z]+)", code, re.M))
    assert used and used <= commands, used - commands

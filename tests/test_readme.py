"""The README's examples say what the code does."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
PAGES = README + "".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))


def test_the_python_profile_example_prints_the_number_it_shows():
    block = next(b for b in re.findall(r"```python\n(.*?)```", PAGES, re.S) if "diffmeter.profile(" in b)
    namespace: dict = {}
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if re.fullmatch(r"\d+ \(MACs\)", comment.strip()):
            assert eval(code, namespace) == int(comment.split()[0]), line  # noqa: S307 (our own README)
        elif line and not line.startswith((" ", "for ")):
            exec(line, namespace)  # noqa: S102


def test_every_command_in_the_readme_and_docs_exists():
    from typer.main import get_command

    from diffmeter.cli import app

    commands = set(get_command(app).commands)
    code = "\n".join(re.findall(r"```(?:bash|console)\n(.*?)```", PAGES, re.S))
    used = set(re.findall(r"^\s*(?:\$ )?diffmeter ([a-z]+)", code, re.M))
    assert used and used <= commands, used - commands


def test_the_readme_stays_short_and_every_page_link_resolves():
    """README.md under 200 lines, the rest in docs/ pages it links; no link in them points at nothing."""
    assert len(README.splitlines()) < 200
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which is missing"

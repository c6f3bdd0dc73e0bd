"""`diffmeter optimizations`' family matrix: what it says of a backend that reads the user's own file."""

import json


def test_a_backend_reading_the_users_file_is_not_said_to_apply_to_none(cli):
    """The family matrix said gguf applies to "none here" while the backends table below says it runs on this CPU
    (a new user's trial): without the user's file nothing tells, and it says so; Nunchaku, CUDA-only, is refused
    on this CPU whatever its folder."""
    code, out, _ = cli("optimizations", "--json")
    cells = json.loads(out)
    assert code == 0 and all(cell["needs_weights"] for cell in cells["gguf"].values())
    assert not any(cell["needs_weights"] for cell in cells["nunchaku"].values())
    code, out, _ = cli("optimizations")
    rows = {}  # the family matrix's row of each technique (the backends table below names them again)
    for line in out.splitlines():
        if line.startswith("│"):
            rows.setdefault(line.split("│")[1].strip(), line)
    assert "checked with its file (--weights)" in rows["gguf"] and "none here" in rows["nunchaku"]

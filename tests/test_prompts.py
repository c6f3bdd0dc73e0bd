"""Prompt sources: the shipped set, local files in three formats, seeded sampling."""

import pytest

from diffmeter.errors import DiffmeterError
from diffmeter.runs.prompts import builtin_prompts, prompt_pool, read_prompts


def test_shipped_set_is_large_varied_and_unique():
    prompts = builtin_prompts()
    words = sorted(len(prompt.split()) for prompt in prompts)
    assert len(prompts) >= 200 and len(set(prompts)) == len(prompts)
    assert words[0] <= 10 and words[-1] >= 31  # short and long prompts: text compute varies with length


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("p.txt", "a red cat\n\n  a blue dog  \n"),
        ("p.jsonl", '{"prompt": "a red cat"}\n\n{"text": "a blue dog", "id": 2}\n'),
        ("p.csv", 'id,prompt\n1,a red cat\n2,"a blue dog"\n'),
    ],
)
def test_local_files(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert read_prompts(path) == ["a red cat", "a blue dog"]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("p.jsonl", "{not json}\n", "p.jsonl:1 is not JSON"),
        ("p.jsonl", '{"caption_x": "a"}\n', "has no prompt"),
        ("p.csv", "id,words\n1,a cat\n", "no 'prompt' column"),
        ("p.txt", "\n\n", "holds no prompts"),
    ],
)
def test_bad_files_say_what_to_fix(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DiffmeterError, match=message):
        read_prompts(path)


def test_sampling_follows_the_seed_and_cycles_small_sources(tmp_path):
    assert prompt_pool(None, None, 8, seed=1) == prompt_pool(None, None, 8, seed=1)
    assert prompt_pool(None, None, 8, seed=1) != prompt_pool(None, None, 8, seed=2)
    path = tmp_path / "two.txt"
    path.write_text("one\ntwo\n")
    pool = prompt_pool(None, str(path), 5, seed=0)
    assert sorted(pool[:2]) == ["one", "two"] and pool[2:4] == pool[:2]
    assert prompt_pool("just this", None, 5, seed=0) == ["just this"]

"""The disk cache answers repeated questions without loading torch, and never answers a changed one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffmeter.catalog import resolve
from diffmeter.flops.cached import cached_params, cached_profile
from diffmeter.spec import ProfileSpec


def test_a_profile_is_remembered_and_a_changed_question_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    from diffmeter import profile
    from diffmeter.flops.profile import MetaComponent

    MetaComponent._params.clear()  # counted earlier in this process: forget it, so it is counted and stored
    spec = ProfileSpec(model="tiny-sd", steps=2)
    assert cached_profile(spec) is None
    counted = profile("tiny-sd", steps=2)
    assert cached_profile(spec) == counted
    assert cached_profile(ProfileSpec(model="tiny-sd", steps=3)) is None  # another setting
    assert cached_profile(spec, depth=1) is None  # another level of detail
    component = resolve("tiny-sd").components["unet"]
    assert cached_params(component) is not None
    changed = component.model_copy(update={"config": {**component.config, "layers_per_block": 3}})
    assert cached_params(changed) is None  # another config


def test_the_fingerprint_covers_the_data_answers_read_not_only_the_code(tmp_path):
    """A catalog edit or new memory checks change every key: never a stale answer. The time calibration does not:
    no cached answer reads it (times are computed from the cached operators on every call), so a refit keeps them."""
    from diffmeter import cache

    files = cache.package_files(Path(cache.__file__).parent)
    assert "predict/data/efficiency.json" in files and "predict/data/memory_checks.json" in files
    assert "catalog/data/flux-dev.json" in files and "cache.py" in files
    assert not [name for name in files if "__pycache__" in name]
    (tmp_path / "a.py").write_text("x = 1")
    data = tmp_path / "predict" / "data"
    data.mkdir(parents=True)
    (data / "efficiency.json").write_text("{}")
    (data / "memory_checks.json").write_text("{}")
    assert cache.package_files(tmp_path) == ["a.py", "predict/data/efficiency.json", "predict/data/memory_checks.json"]
    digests = [cache.package_digest(tmp_path)]
    (data / "efficiency.json").write_text('{"hopper": 0.5}')
    digests.append(cache.package_digest(tmp_path))
    (data / "memory_checks.json").write_text('{"tiny-sd": 1}')
    digests.append(cache.package_digest(tmp_path))
    (tmp_path / "a.py").write_text("x = 2")
    digests.append(cache.package_digest(tmp_path))
    assert digests[0] == digests[1] != digests[2] != digests[3] != digests[0]


def test_no_module_a_cached_answer_may_run_imports_what_the_fingerprint_leaves_out():
    """The fits are left out of the fingerprint: safe only while no other module imports them (by any import
    form, at any depth), and only the calibration module (through roofline) reads the calibration they write, after
    the cache."""
    from diffmeter import cache

    package = Path(cache.__file__).parent
    left_out = {name.removesuffix(".py").replace("/", ".") for name in cache.UNCACHED if name.endswith(".py")}
    assert left_out == {"predict.fit_published", "predict.fit_holdout", "predict.fit_energy"}
    importers = {}
    for source in package.rglob("*.py"):
        module = str(source.relative_to(package)).removesuffix(".py").replace("/", ".")
        for target in imported_modules(package, module) & left_out if module not in left_out else ():
            importers.setdefault(target, []).append(module)
    assert importers == {}
    readers = [s.relative_to(package) for s in package.rglob("*.py") if "efficiency.json" in s.read_text()]
    assert sorted(map(str, readers)) == [
        "cache.py",
        "predict/calibration.py",
        "predict/fit_published.py",
        "predict/host_time.py",
        "predict/roofline.py",
    ]


@pytest.mark.parametrize(
    "command",
    [
        ("profile", "tiny-flux", "--json"),
        # Qwen2.5-VL's config was rewritten in place by transformers while counting: its key changed, never a hit
        ("profile", "tiny-qwenimage", "--json"),
        ("profile", "tiny-hidream", "--json"),  # a Llama text encoder
        ("models", "--json"),
        ("profile", "--all", "--json"),  # which pipelines refuse the settings: remembered too
    ],
)
@pytest.mark.slow
def test_a_cached_answer_is_printed_without_importing_torch(tmp_path, command):
    script = (
        "import sys\n"
        "from diffmeter.cli import main\n"
        f"sys.argv = ['diffmeter', *{list(command)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    environment = {**os.environ, "DIFFMETER_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    assert first.stdout.strip().endswith("TORCH") and second.stdout.strip().endswith("NO-TORCH")
    payload = lambda out: json.loads(out.rstrip()[: out.rstrip().rindex("\n")])  # noqa: E731 - all but the last line
    assert payload(first.stdout) == payload(second.stdout)


def test_building_a_component_leaves_its_catalog_config_as_it_was():
    import copy

    from diffmeter.pipelines import build_component

    component = resolve("tiny-qwenimage").components["text_encoder"]
    before = copy.deepcopy(component.config)
    build_component(component)
    assert component.config == before


def imported_modules(package: Path, module: str) -> set[str]:
    """The package's modules ``module`` names in an import statement, at any depth of its code, and the packages
    whose ``__init__`` those imports run."""
    import ast

    source = package / (module.replace(".", "/") + ".py")
    if not source.exists():
        source = package / module.replace(".", "/") / "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(source.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")[1:] if name.startswith("diffmeter.") else []
            found |= {".".join(parts[:depth]) for depth in range(1, len(parts) + 1)}
    return {
        name
        for name in found
        if (package / (name.replace(".", "/") + ".py")).exists()
        or (package / name.replace(".", "/") / "__init__.py").exists()
    }


def test_no_count_or_memory_prediction_runs_or_reads_what_its_key_leaves_out():
    """Operator counts and memory predictions are keyed without the time's modules (``cache.TIME_ONLY``): safe only
    while nothing they run imports one, by any import form at any depth, the families and tiny tokenizers their
    registries import by name included; and while the time's data files are read by the time's modules only."""
    from diffmeter import cache

    package = Path(cache.__file__).parent
    roots = {"predict.operators", "predict.memory", "families", "tiny"}
    roots |= {f"{folder}.{path.stem}" for folder in ("families", "tiny") for path in (package / folder).glob("*.py")}
    reached, waiting = set(), list(roots)
    while waiting:
        module = waiting.pop()
        if module not in reached and not module.endswith("__init__"):
            reached.add(module)
            waiting.extend(imported_modules(package, module))
    assert {"predict.operators", "predict.compiled_time", "families.flux"} <= reached  # the walk follows imports
    time_modules = {name.removesuffix(".py").replace("/", ".") for name in cache.TIME_ONLY if name.endswith(".py")}
    assert time_modules and not time_modules & reached
    above = [module for module in reached if any(module.startswith(f"{layer[:-1]}.") for layer in cache.ABOVE_COUNTS)]
    assert not above, above  # a layer above the counts keyed out of them is imported by a count
    for layer in cache.ABOVE_COUNTS:  # and its data files are read by its own modules only
        for data in (f for f in (package / layer).rglob("*") if f.is_file() and f.suffix not in (".py", ".pyc")):
            readers = {str(s.relative_to(package)) for s in package.rglob("*.py") if data.name in s.read_text()}
            assert all(r.startswith(cache.ABOVE_COUNTS) for r in readers), (data, readers)
    for data in (name for name in cache.TIME_ONLY if not name.endswith(".py")):
        readers = {str(s.relative_to(package)) for s in package.rglob("*.py") if Path(data).name in s.read_text()}
        assert readers and readers <= set(cache.TIME_ONLY) | {"cache.py"}, data
    assert set(cache.COUNT_KINDS) == {"memory", "operators"}


def test_a_change_to_the_time_keeps_counts_and_changes_every_other_answer(tmp_path):
    from diffmeter import cache

    (tmp_path / "predict").mkdir()
    (tmp_path / "predict" / "roofline.py").write_text("x = 1")
    (tmp_path / "predict" / "operators.py").write_text("y = 1")
    counts, everything = (
        cache.package_digest(tmp_path, cache.UNCACHED + cache.TIME_ONLY),
        cache.package_digest(tmp_path),
    )
    (tmp_path / "predict" / "roofline.py").write_text("x = 2")
    assert cache.package_digest(tmp_path, cache.UNCACHED + cache.TIME_ONLY) == counts
    assert cache.package_digest(tmp_path) != everything
    (tmp_path / "predict" / "operators.py").write_text("y = 2")
    assert cache.package_digest(tmp_path, cache.UNCACHED + cache.TIME_ONLY) != counts
    keyed_out = cache.UNCACHED + cache.TIME_ONLY + cache.ABOVE_COUNTS
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "profile.py").write_text("z = 1")
    counts = cache.package_digest(tmp_path, keyed_out)
    (tmp_path / "cli" / "profile.py").write_text("z = 2")  # a layer above the counts: counts kept
    assert cache.package_digest(tmp_path, keyed_out) == counts
    (tmp_path / "client.py").write_text("w = 1")  # a file whose name only begins like a layer's is counted
    assert cache.package_digest(tmp_path, keyed_out) != counts

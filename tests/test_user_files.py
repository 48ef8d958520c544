"""A user's own data, plugins and overrides through the command line: every bad input is one
line on stderr, exit code 2 and no results written.

The commands run in this process (``cli.main``); tests/test_examples.py runs the whole path
in a real subprocess.
"""

import itertools
import re

import numpy as np
import pytest

pytest.importorskip("ase")

import ase.io
from ase.collections import g2

from stability import cli

NAMES = ["H2O", "CH4", "NH3", "C2H6", "CO2", "HCN"]
_unique = itertools.count()


def molecules():
    out = []
    for name in NAMES:
        atoms = g2[name]
        atoms.info["y"] = float(len(atoms))
        out.append(atoms)
    return out


def case(dataset_extra="", top="", variants='["raw_e"]'):
    return (
        f"variants = {variants}\nseeds = [0]\nepochs = 1\nbatch_sizes = [4]\n{top}\n"
        f'[model]\nhidden = 4\n[dataset]\nname = "structures"\npath = "data/m.extxyz"\n'
        f'target = "y"\n{dataset_extra}'
    )


@pytest.fixture
def folder(tmp_path, monkeypatch, isolated_registries):
    """A user's folder: cases/c.toml reads cases/data/m.extxyz; commands run from tmp_path."""
    (tmp_path / "cases" / "data").mkdir(parents=True)
    ase.io.write(tmp_path / "cases" / "data" / "m.extxyz", molecules())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plugin(folder, body):
    """A plugin file with a name no other test has imported (modules are process-wide)."""
    name = f"user_plugin_{next(_unique)}"
    (folder / "cases" / f"{name}.py").write_text(body)
    return name


def run(folder, capsys, *flags, text=None):
    if text is not None:
        (folder / "cases" / "c.toml").write_text(text)
    code = cli.main(["run", "cases/c.toml", "--out", "out", "--no-progress", *flags])
    captured = capsys.readouterr()
    return code, captured.err


def assert_bad(code, err, message, folder):
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("stability: error: "), err
    assert message in err, err
    assert not list((folder / "out").glob("*.csv")) if (folder / "out").exists() else True


def write_structures(folder, atoms_list):
    ase.io.write(folder / "cases" / "data" / "m.extxyz", atoms_list)


def test_a_relative_path_resolves_against_the_case_file_and_trains(folder, capsys):
    code, err = run(folder, capsys, text=case())
    assert code == 0, err
    assert (folder / "out" / "c.csv").exists()


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (
            lambda m: m[2].info.pop("y"),
            "cases/data/m.extxyz: structure 2 (H3N): has no target 'y'",
        ),
        (
            lambda m: m[4].positions.__setitem__((0, 0), np.nan),
            "cases/data/m.extxyz: structure 4 (CO2): positions hold NaN or Inf",
        ),
    ],
    # A structure without edges is no longer bad input: tests/test_structures.py keeps it.
    ids=["missing-target", "nan-positions"],
)
def test_bad_structures(folder, capsys, spoil, message):
    atoms = molecules()
    spoil(atoms)
    write_structures(folder, atoms)
    assert_bad(*run(folder, capsys, text=case()), message, folder)


def test_an_unreadable_file(folder, capsys):
    (folder / "cases" / "data" / "m.extxyz").write_text("not\na structure\n")
    assert_bad(
        *run(folder, capsys, text=case()),
        "cases/data/m.extxyz: cannot read it as any format ASE knows",
        folder,
    )


def test_a_missing_file(folder, capsys):
    assert_bad(
        *run(folder, capsys, text=case().replace("data/m.extxyz", "data/absent.xyz")),
        "cases/data/absent.xyz: no such structure file",
        folder,
    )


def test_a_bad_create_recipe_option_fails_before_any_training(folder, capsys):
    name = plugin(
        folder,
        "from stability import create_recipe, register_variant\n"
        "@register_variant\n"
        "def tanh_typo(ctx):\n"
        "    return create_recipe(ctx, softmax='tanh')\n",
    )
    text = case(top=f'plugins = ["{name}.py"]', variants='["raw_e", "tanh_typo"]')
    code, err = run(folder, capsys, text=text)
    assert_bad(code, err, "variant 'tanh_typo' cannot be built: unknown softmax 'tanh'", folder)
    assert not (folder / "out" / "c.csv").exists()  # raw_e did not train first
    # The next run is not blocked by a half-written CSV.
    code, err = run(folder, capsys, text=case(top=f'plugins = ["{name}.py"]'))
    assert code == 0, err


def test_plugins_by_path_and_by_case_and_a_registered_logit_transform(folder, capsys):
    body = (
        "import tensorflow as tf\n"
        "from stability import create_recipe, register_logit_transform, register_variant\n"
        "@register_logit_transform\n"
        "def squash_{n}(logits):\n"
        "    return 20.0 * tf.tanh(logits / 20.0)\n"
        "@register_variant\n"
        "def squashed_{n}(ctx):\n"
        "    '''naive softmax on squashed logits'''\n"
        "    return create_recipe(ctx, logit_transform='squash_{n}')\n"
    )
    by_flag = plugin(folder, body.format(n="a"))
    text = case(variants='["squashed_a"]')
    code, err = run(folder, capsys, "--plugin", f"cases/{by_flag}.py", text=text)
    assert code == 0, err
    by_case = plugin(folder, body.format(n="b"))
    text = case(top=f'plugins = ["{by_case}.py"]', variants='["squashed_b"]')
    code, err = run(folder, capsys, "--overwrite", text=text)
    assert code == 0, err


def test_an_unknown_variant_or_data_set_suggests_plugin(folder, capsys):
    code, err = run(folder, capsys, text=case(variants='["my_fix"]'))
    assert_bad(code, err, "name it with --plugin my_module.py", folder)
    code, err = run(folder, capsys, text=case().replace('"structures"', '"my_molecules"'))
    assert_bad(code, err, "name it with --plugin my_module.py", folder)


@pytest.mark.parametrize(
    ("flags", "top", "message"),
    [
        (["--plugin", "absent.py"], "", "plugin 'absent.py': no such .py file"),
        ([], 'plugins = ["absent.py"]', "cases/c.toml: plugins: plugin 'absent.py': no such"),
        ([], "plugins = [3]", "plugins = [3] is not valid"),
        (["--set", "epochs=0"], "", "cases/c.toml: epochs = 0 is not valid; expected an integer"),
        (["--set", "epoch=3"], "", "unknown key 'epoch'. Did you mean 'epochs'?"),
        (["--set", "dataset.cutof=3"], "", "unknown key dataset.'cutof'"),
        (["--set", "dataset.cutoff=near"], "", "dataset.cutoff = 'near' is not valid"),
        (["--set", "epochs"], "", "--set 'epochs': expected KEY=VALUE"),
        (["--set", "a.b.c=1"], "", "--set 'a.b.c=1': expected KEY=VALUE"),
    ],
    ids=[
        "plugin-path",
        "case-plugin-path",
        "case-plugin-type",
        "set-value",
        "set-key",
        "set-dataset-key",
        "set-dataset-value",
        "set-no-equals",
        "set-too-deep",
    ],
)
def test_bad_plugins_and_overrides(folder, capsys, flags, top, message):
    assert_bad(*run(folder, capsys, *flags, text=case(top=top)), message, folder)


def test_set_overrides_are_used_and_recorded_in_the_report(folder, capsys):
    code, err = run(folder, capsys, "--set", "epochs=2", "--set", "dataset.cutoff=3.5", text=case())
    assert code == 0, err
    report = (folder / "out" / "c.md").read_text()
    assert "`--set epochs=2` `--set dataset.cutoff=3.5`" in report
    assert "cutoff=3.5" in report
    assert re.search(r"\| epochs \(budget\) +\| 2 +\|", report), report
    # `report` regenerates the same markdown when given the same --case and --set.
    (folder / "out" / "c.md").unlink()
    flags = ["--case", "cases/c.toml", "--set", "epochs=2", "--set", "dataset.cutoff=3.5"]
    assert cli.main(["report", "out/c.csv", *flags]) == 0
    assert (folder / "out" / "c.md").read_text() == report
    assert cli.main(["report", "out/c.csv", "--set", "epochs=2"]) == 2
    assert "report --set needs --case" in capsys.readouterr().err


def test_npz_missing_arrays(folder, capsys):
    np.savez(folder / "cases" / "g.npz", nodes=np.ones((2, 2)))
    text = '[dataset]\nname = "npz"\npath = "g.npz"\n'
    assert_bad(
        *run(folder, capsys, text=text),
        "cases/g.npz: lacks the arrays edges, senders, receivers, n_node, n_edge, targets",
        folder,
    )


def test_version_and_list(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("python -m stability ")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[0] == "grad_clip"  # the variant lines come first, as before
    assert "  structures(path='', target='energy', cutoff=4.0" in out
    assert "  npz(path=''" in out


def test_a_parameter_defaulting_to_none_takes_a_value(isolated_registries):
    # The trap: `path: str | None = None` was refused with "expected a NoneType".
    from stability.data import register_dataset
    from stability.sweep.cases import parse_case

    @register_dataset
    def with_optional(*, seed: int = 0, path: str | None = None):
        raise AssertionError("not built by parse_case")

    case = parse_case('[dataset]\nname = "with_optional"\npath = "x.npz"\n')
    assert case.dataset_params["path"].endswith("x.npz")


def test_resume_notices_an_edited_structure_file(folder, capsys):
    code, err = run(folder, capsys, text=case())
    assert code == 0, err
    before = (folder / "out" / "c.csv").read_text()
    edited = molecules()
    edited[0].positions[0, 0] += 0.01
    write_structures(folder, edited)
    code, err = run(folder, capsys, "--resume")
    assert code == 2
    assert "holds runs on data set structures(path='m.extxyz',target='y'," in err
    assert "the data or its file changed" in err
    assert (folder / "out" / "c.csv").read_text() == before

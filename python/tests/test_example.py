"""examples/python/ablate_heads.py runs and finds the planted head (it
asserts that itself, and that ablation agrees with attribution)."""

import pathlib
import runpy

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "ablate_heads.py"


def test_ablate_heads_example(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    printed = capsys.readouterr().out
    assert "head 5 writes most along the direction; ablation confirms it" in printed
    assert "headsum 2.0 MiB (4096x less)" in printed

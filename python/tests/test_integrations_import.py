"""`import headsum` loads neither torch nor transformers: headsum.torch and
headsum.transformers are imported when first named."""

import subprocess
import sys

import headsum


def test_import_headsum_loads_no_integration():
    code = (
        "import sys, headsum\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported eagerly'\n"
        "print(headsum.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == headsum.__version__


def test_unknown_attribute_is_an_attribute_error():
    try:
        headsum.no_such_thing
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("headsum.no_such_thing resolved")

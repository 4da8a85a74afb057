"""The private infrastructure the three packages share (``probseq._validation``, ``probseq._optional``):
one copy each, imported by every package; what each check accepts and the error each raises."""

import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from probseq._optional import missing, require
from probseq._validation import check_dtype, check_int, check_real, check_tensor

PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")


# ----------------------------------------------------------------------------- one copy
@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_keeps_its_own_copy(package):
    assert importlib.util.find_spec(f"{package}._optional") is None
    own = importlib.import_module(f"{package}._validation")
    assert not {"check_tensor", "check_dtype", "check_int", "check_real"} & set(vars(own))


def test_the_packages_call_the_same_functions():  # modules a core install imports
    from gpytorch_hippo import online
    from gpytorch_hippo.data import solar
    from gpytorch_sgpa import elbo, lora, transformer
    from pseudovideo import augment, data

    assert online.check_tensor is elbo.check_tensor is augment.check_tensor is check_tensor
    assert transformer.check_dtype is check_dtype and elbo.check_real is augment.check_real is check_real
    assert solar.require is lora.require is data.require is require


def test_the_shared_modules_and_pseudovideo_import_no_gp_package():
    code = (
        "import sys, probseq._optional, probseq._validation, pseudovideo, pseudovideo.augment, pseudovideo.models.hvae; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'gpytorch', 'gpytorch_hippo', 'gpytorch_sgpa', 'botorch'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- check_tensor
def test_check_tensor_names_the_argument_and_the_fix():
    with pytest.raises(TypeError, match="^x must be a torch.Tensor, got list$"):
        check_tensor([1.0], "x")
    with pytest.raises(TypeError, match="^z must be a real tensor, got dtype torch.complex64$"):
        check_tensor(torch.ones(2, dtype=torch.complex64), "z")
    with pytest.raises(TypeError, match="^x must be a floating-point tensor, got torch.int64$"):
        check_tensor(torch.arange(3), "x", floating=True)
    with pytest.raises(TypeError, match="^x must be a floating-point tensor, got torch.complex64$"):
        check_tensor(torch.ones(2, dtype=torch.complex64), "x", floating=True)
    for dtype in (torch.float32, torch.bool):
        with pytest.raises(TypeError, match=f"^labels must be an integer tensor, got {dtype}$"):
            check_tensor(torch.ones(2, dtype=dtype), "labels", floating=False)
    with pytest.raises(ValueError, match=r"^x must have 3 dimensions, got shape \(2, 2\)$"):
        check_tensor(torch.ones(2, 2), "x", dim=3)
    with pytest.raises(ValueError, match=r"^x must have \(3, 4\) dimensions, got shape \(2,\)$"):
        check_tensor(torch.ones(2), "x", dim=(3, 4))
    with pytest.raises(ValueError, match=r"^X must have at least 2 dimension\(s\), got shape \(2,\)$"):
        check_tensor(torch.ones(2), "X", min_dim=2)
    with pytest.raises(ValueError, match=r"^videos must not be empty \(every dimension >= 1\), got shape \(0, 3\)$"):
        check_tensor(torch.ones(0, 3), "videos", non_empty=True)
    with pytest.raises(TypeError, match="^dtype must be a floating dtype, got torch.int64$"):
        check_tensor(torch.ones(2), "x", dtype=torch.int64)


@pytest.mark.parametrize("value, word", [(math.nan, "NaN"), (math.inf, "infinite"), (-math.inf, "infinite")])
def test_check_tensor_refuses_nonfinite_values_unless_told_not_to(value, word):
    x = torch.tensor([0.0, value])
    with pytest.raises(ValueError, match=f"^signal contains {word} values; expected finite numbers$"):
        check_tensor(x, "signal")
    with pytest.raises(ValueError, match=f"^signal contains {word} values"):
        check_tensor(x, "signal", floating=True, non_empty=True, dtype=torch.float64)
    assert check_tensor(x, "signal", finite=False) is x  # the caller reads the values elsewhere (on the host only)


def test_check_tensor_promotes_as_gpytorch_and_keeps_what_it_accepts():
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert check_tensor(torch.arange(3), "x").dtype == torch.float64  # torch's default floating dtype
    finally:
        torch.set_default_dtype(previous)
    assert check_tensor(torch.arange(3), "x", dtype=torch.float32).dtype == torch.float32
    assert check_tensor(torch.tensor([True, False]), "mask").dtype == torch.get_default_dtype()
    assert torch.equal(check_tensor(torch.arange(3), "x", dtype=torch.float64), torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    assert check_tensor(torch.ones(2, dtype=torch.float32), "x", dtype=torch.float64).dtype == torch.float64
    assert check_tensor(torch.ones(2, dtype=torch.float64), "x", dtype=torch.float32).dtype == torch.float64  # never narrowed
    x = torch.ones(2, 3, dtype=torch.float32)
    assert check_tensor(x, "x", floating=True, dim=(2, 3), min_dim=2, non_empty=True) is x
    labels = torch.tensor([0, 2, 1])
    assert check_tensor(labels, "labels", floating=False, dim=1) is labels  # integers kept with floating=False
    assert check_tensor(torch.ones(0), "x").shape == (0,)  # empty is fine unless non_empty


# ----------------------------------------------------------------------------- check_dtype
def test_check_dtype_names_both_dtypes_and_the_conversion():
    message = (
        r"^images has dtype torch.float64 but the module's parameters are torch.float32: "
        r"convert one of them \(e.g. module.to\(torch.float64\)\)$"
    )
    with pytest.raises(TypeError, match=message):
        check_dtype(torch.ones(2, dtype=torch.float64), "images", torch.float32)
    check_dtype(torch.ones(2), "images", torch.get_default_dtype())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast mixes dtypes itself
        check_dtype(torch.ones(2, dtype=torch.float64), "images", torch.float32)


# ----------------------------------------------------------------------------- numbers
def test_check_int_accepts_integers_only():
    assert check_int(np.int64(3), "epochs") == 3 and type(check_int(np.int64(3), "epochs")) is int
    assert check_int(-5, "seed", low=None) == -5
    with pytest.raises(TypeError, match="^epochs must be an int, got bool$"):
        check_int(True, "epochs")
    with pytest.raises(TypeError, match="^epochs must be an int, got float$"):
        check_int(3.0, "epochs")
    with pytest.raises(TypeError, match="^epochs must be an int, got torch.int64 tensor$"):
        check_int(torch.tensor(3), "epochs")
    with pytest.raises(ValueError, match="^num_frames must be >= 2, got 1$"):
        check_int(1, "num_frames", low=2)


def test_check_real_takes_a_time_read_off_a_column_of_inputs():
    """A HiPPO time given as ``x[-1]`` of ``(N, 1)`` inputs, as GPyTorch models hold them, is a number."""
    from gpytorch_hippo import HiPPOInducingVariables

    x = torch.linspace(0.0, 3.0, 7, dtype=torch.float64).unsqueeze(-1)
    assert check_real(x[-1], "t") == 3.0
    variables = HiPPOInducingVariables(4, "legs", t=x[3])
    variables.advance(x[-1])
    assert variables.t == 3.0
    with pytest.raises(TypeError, match="^t must be a real number, got torch.float64 tensor$"):
        check_real(x[-2:], "t")


def test_check_real_accepts_python_numpy_and_0d_tensor_numbers_in_range():
    assert check_real(np.float32(0.5), "beta") == 0.5
    assert check_real(torch.tensor(2), "beta") == 2.0
    assert check_real(1, "beta", low=1.0, high=1.0) == 1.0
    with pytest.raises(TypeError, match="^beta must be a real number, got bool$"):
        check_real(False, "beta")
    with pytest.raises(TypeError, match=r"^beta must be a real number, got torch.float32 tensor$"):
        check_real(torch.ones(2), "beta")
    with pytest.raises(ValueError, match="^beta must be a finite number, got nan$"):
        check_real(math.nan, "beta")
    with pytest.raises(ValueError, match="^data_range must be > 0.0, got 0.0$"):
        check_real(0.0, "data_range", low=0.0, low_open=True)
    with pytest.raises(ValueError, match="^p must be < 1.0, got 1.0$"):
        check_real(1.0, "p", high=1.0, high_open=True)
    with pytest.raises(ValueError, match="^p must be <= 1.0, got 1.5$"):
        check_real(1.5, "p", high=1.0)


# ----------------------------------------------------------------------------- optional packages
def test_require_imports_or_names_the_extra(monkeypatch):
    assert require("torch.nn", "core", "the models") is torch.nn
    for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(ModuleNotFoundError) as raised:
        require("matplotlib.pyplot", "plots", "the figures")
    assert str(raised.value) == (
        "the figures needs the 'matplotlib' package, which a core install of probseq leaves out: "
        'pip install "probseq[plots]" (or pip install matplotlib)'
    )
    assert raised.value.name == "matplotlib" and isinstance(raised.value.__cause__, ImportError)
    monkeypatch.setitem(sys.modules, "vector_quantize_pytorch", None)
    with pytest.raises(ModuleNotFoundError, match=r"\(or pip install vector-quantize-pytorch\)$"):
        require("vector_quantize_pytorch", "video", "VQ", package="vector-quantize-pytorch")
    error = missing("diffusers", "video", "the diffusion model")
    assert isinstance(error, ModuleNotFoundError) and error.name == "diffusers" and 'pip install "probseq[video]"' in str(error)

"""Write the intersphinx inventories that docs/conf.py reads (``<project>.inv`` in this folder).

    python docs/_intersphinx/build_inventories.py             # offline: from the installed packages
    python docs/_intersphinx/build_inventories.py --download  # each project's own objects.inv

``--download`` fetches every project's published ``objects.inv`` from the URL in docs/conf.py and is
the better choice where the network is reachable. Offline, this script writes a Sphinx inventory of
the installed version's public API instead, placing each object on the page and anchor that the
project's own site uses (PyTorch's ``generated/torch.nn.Module.html#torch.nn.Module``, GPyTorch's
``kernels.html#gpytorch.kernels.RBFKernel``, BoTorch's ``models.html#botorch.models.model.Model``,
NumPy's ``reference/generated/numpy.ndarray.html#numpy.ndarray``, ...). A project whose
inventory already exists is left alone unless it is named on the command line.

The bundled ``python.inv`` and ``scipy.inv`` are the projects' own inventories (of the Python 3.11
and SciPy 1.10 documentation, as the Debian packages ``python3.11-doc`` and ``python-scipy-doc``
ship them); the others were written offline by this script.
"""

import argparse
import importlib
import inspect
import pathlib
import pkgutil
import sys
import urllib.request
import zlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conf import intersphinx_mapping  # noqa: E402

Entry = tuple[str, str, str]  # (name, role, uri)


def _public(names):
    return [name for name in names if not name.startswith("_")]


def _classes_and_functions(module, names=None):
    for name in _public(names if names is not None else getattr(module, "__all__", dir(module))):
        obj = getattr(module, name, None)
        if inspect.isclass(obj):
            yield name, obj, "class"
        elif callable(obj):
            yield name, obj, "function"


def torch_entries() -> list[Entry]:
    import torch
    import torch.nn.functional
    import torch.optim

    out: list[Entry] = [("torch.Tensor", "class", "tensors.html#torch.Tensor"), ("torch.Size", "class", "size.html#torch.Size")]
    out += [(f"torch.{n}", "class", f"tensor_attributes.html#torch.{n}") for n in ("dtype", "device", "layout", "memory_format")]
    for name in _public(dir(torch.Tensor)):
        if callable(getattr(torch.Tensor, name, None)):
            out.append((f"torch.Tensor.{name}", "method", f"generated/torch.Tensor.{name}.html#torch.Tensor.{name}"))
    for name, obj, role in _classes_and_functions(torch, _public(dir(torch))):
        if role == "function" or name in ("Generator", "Stream", "Event"):
            out.append((f"torch.{name}", role, f"generated/torch.{name}.html#torch.{name}"))
    for sub in ("nn", "nn.functional", "linalg", "fft", "special", "autograd", "func"):
        module = importlib.import_module(f"torch.{sub}")
        for name, obj, role in _classes_and_functions(module, _public(dir(module))):
            if sub == "nn" and (role != "class" or not issubclass(obj, torch.nn.Module)):
                continue
            full = f"torch.{sub}.{name}"
            out.append((full, role, f"generated/{full}.html#{full}"))
    for name in _public(dir(torch.nn.Module)):
        if callable(getattr(torch.nn.Module, name)):
            out.append((f"torch.nn.Module.{name}", "method", f"generated/torch.nn.Module.html#torch.nn.Module.{name}"))
    out.append(("torch.nn.parameter.Parameter", "class", "generated/torch.nn.parameter.Parameter.html#torch.nn.parameter.Parameter"))
    out.append(("torch.nn.Parameter", "class", "generated/torch.nn.parameter.Parameter.html#torch.nn.parameter.Parameter"))
    ddp = "torch.nn.parallel.DistributedDataParallel"
    out.append((ddp, "class", f"generated/{ddp}.html#{ddp}"))
    out.append(("torch.optim.Optimizer", "class", "optim.html#torch.optim.Optimizer"))
    for name, obj, role in _classes_and_functions(torch.optim):
        if role == "class" and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer:
            out.append((f"torch.optim.{name}", "class", f"generated/torch.optim.{name}.html#torch.optim.{name}"))
    for name, obj, role in _classes_and_functions(torch.distributions):
        if role == "class":
            anchor = f"{obj.__module__}.{obj.__qualname__}"
            out += [(path, "class", f"distributions.html#{anchor}") for path in (anchor, f"torch.distributions.{name}")]
    for name in ("DataLoader", "Dataset", "TensorDataset", "IterableDataset", "Sampler"):
        full = f"torch.utils.data.{name}"
        out.append((full, "class", f"data.html#{full}"))
    return out


GPYTORCH_PAGES = {
    "kernels": "kernels",
    "means": "means",
    "likelihoods": "likelihoods",
    "models": "models",
    "mlls": "marginal_log_likelihoods",
    "distributions": "distributions",
    "variational": "variational",
    "constraints": "constraints",
    "priors": "priors",
}


def gpytorch_entries() -> list[Entry]:
    out: list[Entry] = [("gpytorch.Module", "class", "module.html#gpytorch.Module")]
    for name in ("_VariationalStrategy", "_VariationalDistribution"):  # documented base classes
        out.append((f"gpytorch.variational.{name}", "class", f"variational.html#gpytorch.variational.{name}"))
    for sub, page in GPYTORCH_PAGES.items():
        module = importlib.import_module(f"gpytorch.{sub}")
        for name, obj, role in _classes_and_functions(module):
            out.append((f"gpytorch.{sub}.{name}", role, f"{page}.html#gpytorch.{sub}.{name}"))
    return out


def botorch_entries() -> list[Entry]:
    """BoTorch documents each module with automodule on the page of its subpackage."""
    import botorch

    out: list[Entry] = []
    for info in pkgutil.walk_packages(botorch.__path__, "botorch."):
        parts = info.name.split(".")
        if any(part.startswith("_") for part in parts) or parts[1] in ("test_utils",):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # optional dependencies of a few modules
            continue
        page = "gen" if parts[1] == "generation" and len(parts) > 2 and parts[2] == "gen" else parts[1]
        for name, obj, role in _classes_and_functions(module, _public(vars(module))):
            if getattr(obj, "__module__", None) == info.name:
                out.append((f"{info.name}.{name}", role, f"{page}.html#{info.name}.{name}"))
    return out


def linear_operator_entries() -> list[Entry]:
    import linear_operator

    out: list[Entry] = [("linear_operator.LinearOperator", "class", "linear_operator.html#linear_operator.LinearOperator")]
    for name in _public(dir(linear_operator.LinearOperator)):
        if callable(getattr(linear_operator.LinearOperator, name, None)):
            out.append((f"linear_operator.LinearOperator.{name}", "method", f"linear_operator.html#linear_operator.LinearOperator.{name}"))
    return out


def numpy_entries() -> list[Entry]:
    import numpy

    out: list[Entry] = [("numpy.ndarray", "class", "reference/generated/numpy.ndarray.html#numpy.ndarray")]
    for name, obj, role in _classes_and_functions(numpy, _public(dir(numpy))):
        if role == "function":
            out.append((f"numpy.{name}", "function", f"reference/generated/numpy.{name}.html#numpy.{name}"))
    out.append(("numpy.random.Generator", "class", "reference/random/generator.html#numpy.random.Generator"))
    return out


BUILDERS = {
    "torch": torch_entries,
    "gpytorch": gpytorch_entries,
    "botorch": botorch_entries,
    "linear_operator": linear_operator_entries,
    "numpy": numpy_entries,
}


def write_inventory(path: pathlib.Path, project: str, version: str, entries: list[Entry]) -> None:
    """Sphinx inventory version 2: a plain header, then zlib-compressed lines."""
    lines = sorted({f"{name} py:{role} 1 {uri} -" for name, role, uri in entries})
    header = (
        f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    path.write_bytes(header.encode() + zlib.compress(("\n".join(lines) + "\n").encode()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("projects", nargs="*", help="projects to (re)write; default: the missing ones")
    parser.add_argument("--download", action="store_true", help="fetch each project's published objects.inv")
    args = parser.parse_args()
    for project, (url, _) in intersphinx_mapping.items():
        path = HERE / f"{project}.inv"
        if (args.projects and project not in args.projects) or (not args.projects and path.exists()):
            continue
        if args.download:
            with urllib.request.urlopen(url + "objects.inv", timeout=60) as response:
                path.write_bytes(response.read())
        elif project in BUILDERS:
            version = importlib.import_module(project).__version__
            write_inventory(path, project, version, BUILDERS[project]())
        else:
            print(f"{project}: no offline builder; run with --download", file=sys.stderr)
            continue
        print(f"wrote {path.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()

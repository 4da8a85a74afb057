"""``probseq._compat``, every access to another library's private internals, against the installed (tested)
versions: each accessor gives what the public behaviour around it gives (BoTorch's own fit and paths, GPyTorch's
dtype setting, transformers' attention recording), and an internal missing from another version raises an error
naming the version to install instead of being skipped."""

import ast
import pathlib
import re
import subprocess
import sys

import gpytorch
import pytest
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.sampling.pathwise import draw_kernel_feature_paths
from gpytorch.mlls import ExactMarginalLogLikelihood

from probseq import _compat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tested_versions_are_the_pinned_ones():
    constraints = (ROOT / "constraints.txt").read_text()
    for library, version in _compat.TESTED_VERSIONS.items():
        assert re.search(rf"^{library}=={re.escape(version)}$", constraints, re.MULTILINE), library


def test_importing_the_module_imports_no_upstream_library():
    """``pseudovideo`` may import it: it must not import the GP libraries (nor transformers) by itself."""
    code = "import sys, probseq._compat; print(sorted({'torch', 'gpytorch', 'botorch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(_compat.PRIVATE_NAMES))
def test_each_private_name_is_a_class_of_the_installed_version(name):
    assert isinstance(getattr(_compat, name), type)


def test_the_type_checkers_names_are_the_runtime_ones():
    """mypy reads the private classes from the ``TYPE_CHECKING`` imports, the code from :data:`PRIVATE_NAMES`."""
    tree = ast.parse(pathlib.Path(_compat.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    imports = {alias.asname: (node.module, alias.name) for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imports == {name: (module, private) for name, (module, private, _) in _compat.PRIVATE_NAMES.items()}


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _compat.Nothing  # noqa: B018


def test_cholesky_dtype_follows_gpytorchs_public_setting():
    assert _compat.cholesky_dtype() == torch.float64
    with gpytorch.settings.linalg_dtypes(cholesky=torch.float32):
        assert _compat.cholesky_dtype() == torch.float32


def test_without_memoized_values_drops_what_gpytorchs_cache_memoised():
    """A copy built from the state loses the values GPyTorch's ``@cached`` memoised (it recomputes them); the module
    keeps its own."""
    from gpytorch.utils.memoize import cached

    class Memo(gpytorch.Module):
        calls = 0

        @cached(name="value")
        def value(self):
            Memo.calls += 1
            return Memo.calls

    module = Memo()
    assert module.value() == module.value() == 1
    copy = Memo.__new__(Memo)
    copy.__setstate__(_compat.without_memoized_values(module.__getstate__()))
    assert copy.value() == 2 and module.value() == 1


def _gp(**kwargs):
    torch.manual_seed(0)
    X = torch.rand(12, 2, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    return SingleTaskGP(X, Y, **kwargs)


def test_fit_mll_generic_is_botorchs_fit_of_a_single_task_gp():
    ours, reference = _gp(), _gp()
    _compat.fit_mll_generic(ExactMarginalLogLikelihood(ours.likelihood, ours))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(reference.likelihood, reference))
    for (name, value), expected in zip(ours.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(value, expected, msg=name)


def test_validate_tensor_args_refuses_what_single_task_gp_refuses():
    X, y = torch.rand(5, 2, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    _compat.validate_tensor_args(X, y.unsqueeze(-1))
    with pytest.raises(BotorchTensorDimensionError) as reference:
        SingleTaskGP(X, y)
    with pytest.raises(BotorchTensorDimensionError, match=re.escape(str(reference.value))):
        _compat.validate_tensor_args(X, y)


def test_generic_kernel_feature_paths_are_botorchs_paths_of_a_single_task_gp():
    model, x = _gp(outcome_transform=None), torch.rand(7, 2, dtype=torch.float64)
    torch.manual_seed(1)
    ours = _compat.generic_kernel_feature_paths(
        num_inputs=2, mean_module=model.mean_module, covar_module=model.covar_module, sample_shape=torch.Size([3])
    )
    torch.manual_seed(1)
    reference = draw_kernel_feature_paths(model, sample_shape=torch.Size([3]))
    torch.testing.assert_close(ours(x), reference(x))


def test_forward_hooks_lists_the_registered_hooks():
    module, hook = torch.nn.Linear(2, 2), lambda module, args, output: None
    module.register_forward_hook(hook)
    assert _compat.forward_hooks(module) == [hook]


def test_moved_forward_hooks_run_on_the_new_module_and_their_handles_remove_them():
    old, new, seen = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), []
    handles = [
        old.register_forward_pre_hook(lambda module, args, kwargs: seen.append(("pre", module)), with_kwargs=True),
        old.register_forward_hook(lambda module, args, output: seen.append(("post", module)), always_call=True),
    ]
    _compat.move_forward_hooks(old, new)
    new(torch.zeros(1, 2))
    assert seen == [("pre", new), ("post", new)]
    for handle in handles:
        handle.remove()
    new(torch.zeros(1, 2))
    assert len(seen) == 2 and _compat.forward_hooks(new) == []


def test_child_modules_keep_a_child_that_fills_two_names():
    shared = torch.nn.Linear(2, 2)
    parent = torch.nn.Module()
    parent.first, parent.second = shared, shared
    parent.register_module("unset", None)
    assert list(_compat.child_modules(parent).items()) == [("first", shared), ("second", shared), ("unset", None)]
    assert [name for name, _ in parent.named_children()] == ["first"]


def test_tensor_version_counts_in_place_changes():
    tensor = torch.zeros(3)
    before = _compat.tensor_version(tensor)
    tensor.add_(1)
    assert _compat.tensor_version(tensor) == before + 1


def _bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, max_position_embeddings=8
    )
    return transformers, transformers.BertModel(config)


def test_transformers_attention_recording_internals():
    """The registry names the attention outputs of a BERT model, and the flag turns on once transformers installs
    its recording hooks (at the first ``output_attentions=True``)."""
    _, model = _bert()
    assert "attentions" in _compat.can_record_registry().get(model)
    assert not _compat.output_capturing_installed(model)
    model.eval()
    model(input_ids=torch.randint(0, 30, (1, 5)), output_attentions=True)
    assert _compat.output_capturing_installed(model)


def test_config_implementations_are_those_the_model_is_built_with():
    transformers, model = _bert()
    config = model.config
    assert _compat.attn_implementation(config) == model.config._attn_implementation
    _compat.set_implementations(config, "eager", None)
    assert _compat.attn_implementation(config) == "eager" and _compat.experts_implementation(config) is None
    assert transformers.BertModel(config).config._attn_implementation == "eager"


def test_a_missing_gpytorch_internal_names_the_version_to_install(monkeypatch):
    monkeypatch.delattr(gpytorch.settings, "_linalg_dtype_cholesky")
    with pytest.raises(_compat.UpstreamInternalsError, match=r"pip install gpytorch==1\.15\.2"):
        _compat.cholesky_dtype()


def test_a_missing_private_class_fails_the_import_naming_the_version(monkeypatch):
    import botorch.utils.types

    monkeypatch.delattr(botorch.utils.types, "_DefaultType")
    with pytest.raises(_compat.UpstreamInternalsError, match=r"botorch\.utils\.types\._DefaultType.*botorch==0\.18\.1"):
        from probseq._compat import DefaultType  # noqa: F401


def test_converting_a_model_without_transformers_recording_registry_raises(monkeypatch):
    """A transformers without the registry of recorded outputs: converting a model raises naming the version
    (the converted model's ``output_attentions`` would otherwise silently return no attention maps)."""
    import gpytorch_sgpa

    transformers, model = _bert()
    monkeypatch.delattr(transformers.utils.output_capturing, "_CAN_RECORD_REGISTRY")
    with pytest.raises(_compat.UpstreamInternalsError, match=r"_CAN_RECORD_REGISTRY.*pip install transformers==5\.24\.0"):
        gpytorch_sgpa.convert(model, attention="kernel")

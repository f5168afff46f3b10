"""The twins stay twins: for each module present in both torch_impl/ and tf_impl/ (same file name),
the public classes, functions and methods defined there (not imported), and their argument names,
are the same, apart from the framework-only names listed in `FRAMEWORK_ONLY`, each with its reason.

A public name does not start with ``_``; a class's API is its public methods, properties and
``__init__`` as written in its own body (what it inherits from ``nn.Module`` or ``keras.Layer`` is
the framework's, not ours). Arguments are compared by name and order; ``self``/``cls`` and the
catch-alls ``*args``/``**kwargs`` (which Keras layers forward to ``keras.Layer``) are not.

`api_of` returns plain JSON-able data, so it can run in a subprocess per framework should importing
both in one process ever become a problem; today both import side by side, and the test skips
cleanly when either framework is missing.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Names one backend has and the other cannot: "module:Qualified.name" ("*" for any module or class)
# -> the reason. A listed class exempts its methods too.
FRAMEWORK_ONLY: dict[str, dict[str, str]] = {
    "torch": {
        "*:*.forward": "nn.Module's call method; Keras spells it call",
        "*:*.extra_repr": "nn.Module's repr hook; Keras has none",
        "weights_io:reset_parameters": "torch creates parameters with its own initialisation, so the "
                                       "seeds' Xavier-uniform is applied after construction; Keras takes "
                                       "initializers in add_weight",
        "checkpoints:to_state_dict": "a .pt holds a torch state dict (plain PyTorch loads it with "
                                     "load_state_dict); Keras has no state dict",
        "checkpoints:from_state_dict": "the inverse of to_state_dict",
        "checkpoints:torch_load": "torch.load(weights_only=True) with errors naming the file: the one "
                                  "unpickler on torch's load path; h5py needs no such guard",
        "checkpoints:read_foreign_state_dict": "the importers read state dicts of other PyTorch models "
                                               "(nn.Transformer, the Annotated Transformer)",
        "cache:step_layout": "eager torch picks a kernel layout per product (oneDNN's packed weights "
                             "for float32 on the CPU, addmm on (in, out) elsewhere); XLA compiles the step's "
                             "products itself, so tf_impl only transposes its generator by row count",
        "cache:lay_out": "a kernel in step_layout's layout",
        "cache:lay_out_weights": "every kernel of a StepWeights or EncoderWeights in step_layout's "
                                 "layout",
        "cache:in_one_buffer": "eager torch keeps a CPU step's plain kernels in one allocation in the "
                               "order the step reads them; XLA allocates its buffers itself",
        "cache:EncoderWeights": "a decode's one encoder pass runs on oneDNN-packed kernels in eager "
                                "torch (2.4 times faster products than nn.Linear's addmm on the CPU); "
                                "TF's encoder pass runs inside the compiled decode, where XLA lays "
                                "out its products itself",
        "stacks:Encoder.infer": "the encoder pass of EncoderWeights",
        "stacks:Encoder.infer_weights": "the encoder's EncoderWeights",
        "stacks:Decoder.infer": "the decoder pass of the forward pass without gradients, on the "
                                "StepWeights laid out and kept as the encoder's (eager torch's "
                                "products run as laid out; TF's forward casts and lays out under "
                                "its own graph)",
        "layers:DecoderLayer.infer": "one layer of Decoder.infer",
        "layers:EncoderLayer.infer": "one layer of the encoder pass of EncoderWeights",
        "layers:EncoderLayer.infer_weights": "one layer's EncoderWeights",
        "cache:CrossFold": "a CPU decode of one item's short source folds eager torch's cross-attention "
                           "into two products over the source (fewer numbers streamed a step, no SDPA "
                           "call); TF's step runs inside the compiled decode, where XLA plans its own "
                           "products",
        "cache:folds_source": "when a cache makes a CrossFold",
        "cache:fold_buffers": "a decode's CrossFolds in one allocation, as in_one_buffer",
        "attention:MultiHeadAttention.fold_source": "one layer's CrossFold",
        "attention:MultiHeadAttention.self_attend_prepared": "the self-attention of the encoder pass "
                                                            "of EncoderWeights (query, key and value "
                                                            "from one packed product)",
    },
    "tf": {
        "*:*.call": "keras.Layer's call method; torch spells it forward",
        "*:*.get_config": "Keras serialisation (from_config, .keras files); torch has none",
        "*:*.from_config": "Keras serialisation, the inverse of get_config",
        "model:Transformer.predict": "keras.Model.predict, overridden to check ids eagerly (XLA drops "
                                     "asserts)",
        "model:Transformer.predict_on_batch": "keras.Model.predict_on_batch, the same rule",
        "model:Transformer.fit": "keras.Model.fit, the same rule (under XLA a bad id made every "
                                 "weight NaN); torch has no fit",
        "model:Transformer.evaluate": "keras.Model.evaluate, the same rule",
        "model:Transformer.train_on_batch": "keras.Model.train_on_batch, the same rule",
        "model:Transformer.test_on_batch": "keras.Model.test_on_batch, the same rule",
        "model:Transformer.export": "keras.Model.export with the (src, tgt) signature by default "
                                    "(a model built at construction has no first call to infer it "
                                    "from); torch's export is torch.export's",
        "model:Transformer.make_predict_function": "Keras' compiled predict, made again when the "
                                                   "model's structure changed (LoRA, precision)",
        "model:Transformer.make_train_function": "Keras' compiled fit step, the same rule",
        "model:Transformer.make_test_function": "Keras' compiled evaluate step, the same rule",
        "attention:MultiHeadAttention.output": "a property over _output: Keras' Layer.output and its "
                                               "saving claim the attribute; torch's is a plain submodule",
        "inputs:to_tensor": "TF also takes arrays and lists (converted without casting); torch takes "
                            "tensors only",
        "inputs:dims": "static-or-dynamic sizes for graph mode; torch shapes are always concrete",
        "inputs:check_training": "Keras passes dropout's mode as the training argument, which a "
                                 "string would turn on; torch reads module.training",
        "inputs:in_xla_context": "XLA compiles asserts to no-ops; torch has no such mode",
        "inputs:runtime_check": "sizes unknown at trace time (tf.function with None dimensions) are "
                                "checked when the graph runs; torch sizes are known when it checks",
        "inputs:guarded": "under XLA a failed check cannot raise: the block collects its conditions "
                          "for poison; torch always raises",
        "inputs:poison": "NaN outputs for a failed check under XLA (as for a bad id); torch raises",
        "inputs:as_raised": "Keras' Layer.__call__ re-raises an error of call wrapped in its own text "
                            "unless marked; nn.Module's __call__ raises it as it is",
        "training:KingmaBaAdam": "Keras' Adam adds eps inside the bias correction; torch.optim.Adam is "
                                 "already Kingma & Ba's Algorithm 1",
        "training:NoamSchedule": "a Keras LearningRateSchedule class; torch uses a LambdaLR",
        "search:GreedyState": "the state tf.while_loop carries (fixed shapes); torch's loop keeps it in "
                              "local variables",
        "search:BeamState": "the same, for beam search",
        "cache:write_position": "TF tensors are immutable and XLA needs fixed shapes: the new key goes in "
                                "by a scatter; torch writes the buffer slice in place",
        "cache:check_free_position": "a full cache refused in every TF mode (graph mode: an Assert; "
                                     "XLA: NaN logits through guarded/poison); torch's step runs "
                                     "eagerly and raises in decode_step",
        "decoding:greedy_decode_tensors": "a SavedModel signature (saved_model.py) is one traced TF "
                                          "graph, so it calls greedy_decode's compiled program on "
                                          "tensors; torch decodes eagerly and exports no graph",
        "decoding:beam_search_tensors": "the same, for beam_search",
        "distributed:logical_cpus": "MirroredStrategy's replicas on a CPU are logical devices TF must "
                                    "create before its runtime starts; torch's workers are processes",
    },
}

# Arguments only one framework has: framework -> "module:Qualified.name" ("*" for every callable)
# -> {argument: reason}. Dropped from the comparison only where the other side lacks the argument.
FRAMEWORK_ARGS: dict[str, dict[str, dict[str, str]]] = {
    "torch": {
        "*": {"dtype": "torch modules take the dtype as an argument; Keras layers through **kwargs"},
        "search:greedy_loop": {"device": "torch allocates the loop state on a device; TF places ops "
                                         "with tf.device scopes"},
        "search:beam_loop": {"device": "as greedy_loop"},
        "search:greedy_search": {"device": "as greedy_loop"},
        "search:beam_search": {"device": "as greedy_loop"},
        "cache:dense": {"relu": "eager torch fuses the feed-forward rectifier into the product's kernel "
                                "(oneDNN's post-op, cuBLASLt's epilogue): one launch fewer a layer "
                                "and step; XLA fuses TF's itself"},
        "training:noam_schedule": {"optimizer": "a LambdaLR wraps an optimizer; a Keras schedule is "
                                                "handed to the optimizer instead"},
        "cache:LayerCache": {"self_keys_values": "eager torch keeps the self-attention's keys and values "
                                                 "in one buffer (self_key and self_value are its views), "
                                                 "written with one copy a step (one kernel of a CUDA "
                                                 "graph's) and gathered with one by a beam search; TF's "
                                                 "tensors are immutable, updated by scatters XLA fuses",
                             "norms": "eager torch's step reads the norms' parameters from its cache "
                                      "and calls no module between two products, whose streamed "
                                      "kernels evict the interpreter's objects (docs/performance.md, "
                                      "\"A step's Python\"); TF's step is traced once",
                             "cross_fold": "a CPU decode of one item's short source reads eager torch's "
                                           "cross-attention folded into two products (CrossFold)"},
    },
    "tf": {
        "*": {"training": "Keras passes dropout's mode as an argument; torch reads module.training"},
        "layers:norm_layer": {"name": "Keras names each layer (the paths of its weights in "
                                      ".weights.h5); torch names come from the attribute"},
        "decoding:greedy_decode": {"compiled": "TF runs the whole search as one tf.function; torch "
                                               "runs eagerly", "jit_compile": "XLA for that function"},
        "decoding:beam_search": {"compiled": "as greedy_decode", "jit_compile": "as greedy_decode"},
        "cache:LayerCache": {"self_key": "torch_impl's cache takes its keys and values as one buffer "
                                         "(self_keys_values) and makes self_key and self_value from it",
                             "self_value": "as self_key"},
        "search:greedy_search": {"compiled": "as decoding.greedy_decode", "jit_compile": "as compiled"},
        "search:beam_search": {"compiled": "as decoding.greedy_decode", "jit_compile": "as compiled"},
    },
}

# Callables whose framework-only arguments may come before shared ones ("module:Qualified.name"
# -> the reason); elsewhere a framework-only argument is keyword-only or last, so that a positional
# call means one thing in both backends.
POSITIONS_FREE: dict[str, str] = {
    "cache:LayerCache": "made by the model's init_cache (and the decoders' reorders) with every field "
                        "named; a user reads a cache, never builds one",
    "training:noam_schedule": "torch's schedulers take the optimizer they drive first "
                              "(LambdaLR(optimizer, ...)); the shared arguments follow in one order",
}

# Modules one backend has and the other cannot: framework -> {module: reason}.
FRAMEWORK_ONLY_MODULES: dict[str, dict[str, str]] = {
    "torch": {"graphs": "cached decoding steps replayed from one CUDA graph (kernel launches, not "
                        "arithmetic, bound an eager step on a GPU); tf_impl compiles its whole "
                        "decoding loop with XLA instead"},
    "tf": {"saved_model": "exports a TensorFlow SavedModel that decodes (TF Serving, TFLite "
                          "converters); a TensorFlow file format with no torch counterpart",
           "pipelines": "the batches of Keras' fit, evaluate and predict checked before a step that "
                        "XLA may compile (where a bad id embeds as NaN); torch has no Keras functions "
                        "and raises at the call"},
}


def _sources(package: str) -> set[str]:
    return {p.stem for p in (ROOT / package).glob("*.py")}


MODULES = sorted(_sources("torch_impl") & _sources("tf_impl"))


def test_a_module_in_one_backend_only_is_listed_with_its_reason():
    torch_only = _sources("torch_impl") - _sources("tf_impl")
    tf_only = _sources("tf_impl") - _sources("torch_impl")
    assert (torch_only, tf_only) == (set(FRAMEWORK_ONLY_MODULES["torch"]),
                                     set(FRAMEWORK_ONLY_MODULES["tf"]))


def _params(fn) -> list[str]:
    """The argument names, ``"*"`` before the keyword-only ones (as a signature spells them)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.KEYWORD_ONLY and "*" not in names:
            names.append("*")
        names.append(p.name)
    return names


def api_of(module_name: str) -> dict[str, list[str] | None]:
    """``{qualified public name: argument names}`` (``None`` for a property) of the public classes,
    functions and methods defined in ``module_name``."""
    module = importlib.import_module(module_name)
    api: dict[str, list[str] | None] = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isclass(obj):
            if "__init__" in obj.__dict__:
                api[name] = _params(obj.__dict__["__init__"])
            elif hasattr(obj, "_fields"):  # a NamedTuple: its fields are its constructor
                api[name] = _params(obj)
            else:
                api[name] = []
            for attr, member in obj.__dict__.items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, property):
                    api[f"{name}.{attr}"] = None
                elif isinstance(member, (staticmethod, classmethod)):
                    api[f"{name}.{attr}"] = _params(member.__func__)
                elif inspect.isfunction(member):
                    api[f"{name}.{attr}"] = _params(member)
        elif inspect.isfunction(inspect.unwrap(obj)):  # functools wrappers (lru_cache) included
            api[name] = _params(obj)
    return api


def _keys(module: str, qualname: str) -> list[str]:
    """The FRAMEWORK_ONLY keys that cover ``module:qualname`` (its class's too)."""
    parts = qualname.split(".")
    keys = [f"{module}:{'.'.join(parts[:i])}" for i in range(1, len(parts) + 1)]
    keys += [f"*:{qualname}"] + ([f"*:*.{parts[-1]}"] if len(parts) > 1 else [])
    return keys


def _exempt(framework: str, module: str, qualname: str) -> bool:
    return any(key in FRAMEWORK_ONLY[framework] for key in _keys(module, qualname))


def _compared(framework: str, module: str, qualname: str, args: list[str], other: list[str]) -> list[str]:
    table = FRAMEWORK_ARGS[framework]
    drop = set(table.get("*", {})) | set(table.get(f"{module}:{qualname}", {}))
    kept = [a for a in args if a not in drop or a in other]
    return kept[:-1] if kept[-1:] == ["*"] else kept  # keyword-only arguments all dropped


def _misplaced(framework: str, module: str, qualname: str, args: list[str], other: list[str]) -> list[tuple]:
    """``(argument, the last compared one)`` for each framework-only argument placed before a
    compared one: torch_impl's ``MultiHeadAttention(d, h, p, 8)`` took 8 as its dtype, tf_impl's
    as its head_dim."""
    if f"{module}:{qualname}" in POSITIONS_FREE:
        return []
    positional = args[:args.index("*")] if "*" in args else args
    kept = [arg for arg in _compared(framework, module, qualname, args, other) if arg in positional]
    if not kept:
        return []
    return [(arg, kept[-1]) for arg in positional[:positional.index(kept[-1])] if arg not in kept]


def mirror_differences(module: str, torch_api: dict, tf_api: dict) -> list[str]:
    """Every difference between the two APIs of ``module``, one readable line each."""
    out = []
    for name in sorted(set(torch_api) - set(tf_api)):
        if not _exempt("torch", module, name):
            out.append(f"{module}: {name} is in torch_impl only")
    for name in sorted(set(tf_api) - set(torch_api)):
        if not _exempt("tf", module, name):
            out.append(f"{module}: {name} is in tf_impl only")
    for name in sorted(set(torch_api) & set(tf_api)):
        a, b = torch_api[name], tf_api[name]
        if (a is None) != (b is None):
            out.append(f"{module}: {name} is a property in {'torch_impl' if a is None else 'tf_impl'} only")
        elif a is not None:
            for framework, args, other in (("torch", a, b), ("tf", b, a)):
                out += [f"{module}: {name}: {framework}_impl's {arg} comes before {last}, so a "
                        f"positional call means another thing in each backend"
                        for arg, last in _misplaced(framework, module, name, args, other)]
            a, b = _compared("torch", module, name, a, b), _compared("tf", module, name, b, a)
            if a != b:
                out.append(f"{module}: {name} arguments differ: torch_impl ({', '.join(a)}) vs "
                           f"tf_impl ({', '.join(b)})")
    return out


@pytest.mark.parametrize("module", MODULES)
def test_public_api_is_mirrored(module):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    differences = mirror_differences(module, api_of(f"torch_impl.{module}"), api_of(f"tf_impl.{module}"))
    assert not differences, "torch_impl and tf_impl differ:\n  " + "\n  ".join(differences)


def test_every_exception_is_still_needed():
    """An exception nobody needs any more is removed, so the list stays short and true."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    used: set[tuple[str, str]] = set()
    for module in MODULES:
        for framework, package in (("torch", "torch_impl"), ("tf", "tf_impl")):
            for name, args in api_of(f"{package}.{module}").items():
                used |= {(framework, key) for key in _keys(module, name) if key in FRAMEWORK_ONLY[framework]}
                for key in ("*", f"{module}:{name}"):
                    used |= {(framework, f"{key}({arg})") for arg in FRAMEWORK_ARGS[framework].get(key, {})
                             if arg in (args or [])}
    listed = {(fw, key) for fw, table in FRAMEWORK_ONLY.items() for key in table}
    listed |= {(fw, f"{key}({arg})") for fw, table in FRAMEWORK_ARGS.items()
               for key, args in table.items() for arg in args}
    unused = sorted(f"{fw}: {key}" for fw, key in listed - used)
    assert not unused, "exceptions no module needs: " + ", ".join(unused)


def test_differences_name_the_module_the_name_and_the_arguments():
    """The report itself, on made-up APIs: one line per difference, framework-only names and args
    left out."""
    torch_api = {"f": ["a", "b"], "C": ["d", "dtype"], "C.go": ["x"], "C.forward": ["x"], "C.p": None,
                 "D": ["a", "dtype", "b"], "E": ["a", "*", "dtype"], "F": ["a", "*", "b"]}
    tf_api = {"f": ["a", "c"], "C": ["d"], "C.call": ["x", "training"], "C.p": ["y"], "g": [],
              "D": ["a", "b"], "E": ["a"], "F": ["a", "b"]}
    assert mirror_differences("m", torch_api, tf_api) == [
        "m: C.go is in torch_impl only",
        "m: g is in tf_impl only",
        "m: C.p is a property in torch_impl only",
        "m: D: torch_impl's dtype comes before b, so a positional call means another thing in each backend",
        "m: F arguments differ: torch_impl (a, *, b) vs tf_impl (a, b)",
        "m: f arguments differ: torch_impl (a, b) vs tf_impl (a, c)",
    ]

"""Decoding behaviour only torch_impl has: decoding switches a module to eval mode and gives the
caller's mode back (Keras layers take ``training`` per call instead), and the search makes one
host sync per step. The contract both backends share is test_decoding.py."""
import copy
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_impl  # noqa: E402
from parity_tests.decoding_cases import MAX_LEN, model_for, sources, tiny_configs, weights_for  # noqa: E402
from parity_tests.matrix import VARIANTS  # noqa: E402
from parity_tests.torch_support import DEVICES, build  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.tolerances import assert_close, bound_for  # noqa: E402


def test_decoding_uses_eval_mode_and_restores_train_mode():
    config = tiny_configs()["tiny-pre-annotated"]  # dropout 0.1
    model = build(config, weights_for(config, 1))
    src = sources(config, 1)
    a = torch_impl.beam_search(model, src, MAX_LEN, 2)
    model.train()
    model.encoder.eval()  # a module the caller put in another mode keeps it
    b = torch_impl.beam_search(model, torch.from_numpy(src), MAX_LEN, 2)
    assert model.training and model.decoder.training and model.decoder.layers[0].training
    assert not model.encoder.training and not model.encoder.layers[0].training
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_decoding_a_model_in_eval_sets_no_mode(monkeypatch):
    """A model already in eval is decoded as it is: no module's ``train`` is called (setting every
    module's flag twice a decode was a millisecond of a GPU decode's host time)."""
    config = tiny_configs()["tiny-pre-annotated"]
    model = build(config, weights_for(config, 1)).eval()
    called = []
    monkeypatch.setattr(torch.nn.Module, "train", lambda self, mode=True: called.append(self))
    torch_impl.greedy_decode(model, sources(config, 1), MAX_LEN)
    assert called == []


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_one_host_sync_per_step(kind, monkeypatch):
    """The loop reads the device once a step (the NaN check and "all finished" together, one
    ``tolist``): counted on ``Tensor.tolist`` and ``Tensor.item``, the host reads the loop could
    make, with the cache (whose position is a Python int: no read)."""
    model = model_for("torch", "tiny-post-standard", "float64", 0)
    config = model.config
    src = torch.from_numpy(sources(config, 0))
    reads = []

    def counted(name):
        original = getattr(torch.Tensor, name)
        return lambda self: reads.append(name) or original(self)

    for name in ("tolist", "item"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    if kind == "greedy":
        result = torch_impl.greedy_decode(model, src, MAX_LEN)
        steps = int(result.lengths.max())
    else:
        result = torch_impl.beam_search(model, src, MAX_LEN, 3, 0.0, True)
        steps = int(result.all_lengths.max())
    # The source check reads the ids' range once, before the loop; then one read a step.
    assert reads == ["tolist"] * (1 + steps), reads


def _tie_heavy_rows(rng, dtype) -> tuple[np.ndarray, int]:
    """A (1..3, 1..4, n) array of few distinct values (ties at the k-th value too), some entries
    and some whole rows NaN, +-inf or +-0 (an unread row of the search is all zeros), n from 1 to
    59 and k from 1 to n: short rows (sorted whole) and long ones (`_top_lowest`'s topk)."""
    n = int(rng.integers(1, 60))
    x = rng.integers(-3, 4, (int(rng.integers(1, 4)), int(rng.integers(1, 5)), n)).astype(dtype)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    hit = rng.random(x.shape) < 0.25
    x[hit] = rng.choice(special, int(hit.sum()))
    whole = rng.random(x.shape[:-1]) < 0.15
    x[whole] = rng.choice(special, int(whole.sum()))[:, None]
    return x, int(rng.integers(1, n + 1))


@pytest.mark.parametrize("device", DEVICES)
def test_beam_selection_is_the_first_k_of_the_stable_descending_sort(device):
    """Beam search's ranking of a beam's tokens (`torch_impl.search._top_lowest`; on the CPU
    `_topk_lowest`: topk, then the ties across the k-th value by id) gives exactly the first k of
    ``torch.sort(descending=True, stable=True)`` (convention 11; NaN first, as that sort puts it),
    on tie-heavy rows and on vocabulary-wide ones (random, and all zeros but pad: an unread row).
    `_topk_lowest` does on every device, and `_lowest_tied`, its path for tied rows, chooses the
    same k on every row, tied or not."""
    from torch_impl.search import _lowest_tied, _top_lowest, _topk_lowest

    def first_k(x, k):
        return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]

    rng = np.random.default_rng(0)
    cases = [_tie_heavy_rows(rng, ("float32", "float64")[i % 2]) for i in range(400)]
    wide = rng.standard_normal((2, 3, 37000)).astype(np.float32)
    wide[1] = 0.0  # every entry tied ...
    wide[1, :, 1] = -np.inf  # ... but pad's
    cases += [(wide, 8), (wide[:, :, :5000].copy(), 1)]
    for x, k in cases:
        x = torch.from_numpy(x).to(device)
        want = first_k(x, k)
        torch.testing.assert_close(_top_lowest(x, k), want, rtol=0, atol=0, msg=f"{x}, k={k}")
        rows = x.reshape(-1, x.shape[-1])
        if k < rows.shape[-1]:
            torch.testing.assert_close(_topk_lowest(x, k), want, rtol=0, atol=0, msg=f"{x}, k={k}")
            kth = torch.topk(rows, k, dim=-1).values[:, -1:]
            got = _lowest_tied(rows, kth, k).sort(dim=-1).values
            torch.testing.assert_close(got, want.reshape(-1, k).sort(dim=-1).values, rtol=0, atol=0,
                                       msg=f"{x}, k={k}")


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_best_token_is_the_first_maximum_but_pad(device):
    """Greedy's choice (`torch_impl.search._best_but`; float32 and float64 on the CPU through
    NumPy's argmax, `shared.decoding.best_but_pad`) is each row's lowest id holding its largest
    value among the tokens but pad, and that value, exactly, with pad first, inside or last, on
    tie-heavy rows (pad often the row's first maximum, +-inf, +-0, rows all alike) and on
    vocabulary-wide ones.
    A row with NaN may answer any token but pad (its log-sum-exp is NaN: unreadable or unread)."""
    from torch_impl.search import _best_but

    rng = np.random.default_rng(5)
    cases = []
    for i in range(300):
        x, _ = _tie_heavy_rows(rng, "float64" if i % 3 == 1 else "float32")
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[1] < 2:
            continue
        pad = int(rng.choice([0, rows.shape[1] - 1, int(rng.integers(0, rows.shape[1]))]))
        lift = rng.random(len(rows)) < 0.5  # pad the row's maximum, often tied with others
        rows[lift, pad] = np.where(np.isnan(rows[lift]), -np.inf, rows[lift]).max(axis=1)
        cases.append((rows, pad, i % 3 == 2))
    wide = rng.standard_normal((3, 37000)).astype(np.float32)
    wide[1] = 0.0  # every entry tied
    wide[2, 7] = wide[2].max() + 1  # pad above every other token
    cases += [(wide, pad, False) for pad in (0, 7, 36999)]
    for rows, pad, half in cases:
        x = torch.from_numpy(rows).to(device)
        x = x.to(torch.bfloat16) if half else x  # the search's torch path on every device
        values = x.float().cpu().numpy() if half else rows
        best, tok = _best_but(x, pad)
        assert best.dtype == x.dtype and tok.dtype == torch.int64 and tok.shape == (len(rows),)
        best, tok = best.float().cpu().numpy(), tok.cpu().numpy()
        for r, row in enumerate(values):
            assert tok[r] != pad and 0 <= tok[r] < len(row), (row, pad)
            if np.isnan(row).any():
                continue
            others = np.delete(np.arange(len(row)), pad)
            top = row[others].max()
            want = others[row[others] == top][0]
            assert tok[r] == want and best[r] == top and np.signbit(best[r]) == np.signbit(row[want]), (row, pad)


@pytest.mark.parametrize("device", DEVICES)
def test_a_beam_search_of_one_source_matches_the_oracle(device):
    """One source a call: its cross-attention keys are kept once for every beam, and the beams
    attend them as one item's queries (`MultiHeadAttention.attend_prepared`); tokens and lengths of
    every beam equal the float64 oracle's, scores within its bound, for each row of the parity
    sources alone (a row with padding, and the all-padding one, whose context is zeroed)."""
    config = tiny_configs()["tiny-pre-annotated"].replace(dtype="float64")
    weights = weights_for(config, 2)
    model, oracle = build(config, weights, device), R.Model(weights, config)
    tol = bound_for("float64", "torch:reference")
    batch = sources(config, 2)
    assert (batch == config.pad_id).all(axis=1)[-1], "the all-padding row is among them"
    for i in range(len(batch)):
        src = batch[i:i + 1]
        got = torch_impl.beam_search(model, torch.from_numpy(src).to(device), MAX_LEN, 3, 0.6, True)
        want = R.beam_search(oracle, src, MAX_LEN, 3, 0.6, True)
        for field in ("tokens", "lengths", "all_tokens", "all_lengths"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"row {i} {field}")
        for field in ("scores", "step_scores", "all_scores"):
            assert_close(getattr(got, field), getattr(want, field), tol, f"row {i} {field}")


def test_the_cross_attention_folds_for_one_item_of_a_short_source_on_the_cpu():
    """`torch_impl.cache.folds_source`: where the folded kernels hold fewer numbers than the two
    kernels and the keys and values they replace (``S * (d - d_k) < d * d_k``: ``S`` up to 73 for
    base), one item, on the CPU, products in the model's dtype."""
    from torch_impl.cache import folds_source
    cpu, f32 = torch.device("cpu"), torch.float32
    assert folds_source(1, 73, 512, 64, cpu, f32, f32) and not folds_source(1, 74, 512, 64, cpu, f32, f32)
    assert folds_source(1, 1000, 64, 64, cpu, f32, f32)  # one head as wide as the model: always fewer
    assert not folds_source(2, 8, 512, 64, cpu, f32, f32)  # an item's kernels each: not for a batch
    assert not folds_source(1, 8, 512, 64, torch.device("cuda"), f32, f32)  # its making outweighs it
    assert not folds_source(1, 8, 512, 64, cpu, torch.bfloat16, f32)  # a half precision's products


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", ["tiny-pre-annotated", "tiny-post-standard"])
def test_a_folded_cross_attention_decodes_as_the_unfolded_one_and_the_oracle(variant, dtype, monkeypatch):
    """Each row of the parity sources alone (full, padded, one token, all padding: a source with
    no key, whose cross-attention output is the output bias alone), at two heads of 8 (so that
    these 7-position sources fold, `torch_impl.cache.CrossFold`): the folded cache's logits are the
    unfolded cache's, step by step, and greedy's and a beam search's tokens the oracle's, scores
    within the dtype's bound of the oracle's."""
    config = tiny_configs()[variant].replace(dtype=dtype, n_heads=2)
    weights = weights_for(config, 5)
    model, oracle = build(config, weights), R.Model(weights, config)
    bound = bound_for(dtype, "torch:reference")
    batch = sources(config, 5)
    tokens = torch.from_numpy(np.random.default_rng(5).integers(3, config.tgt_vocab, 6))

    def logits_of_steps(src):
        with torch.inference_mode():
            mask = torch_impl.inputs.make_src_mask(src, config.pad_id)
            cache, out = model.init_cache(model.encode(src, mask), mask, 6), []
            for t in range(6):
                logits, cache = model.decode_step(tokens[t:t + 1], cache)
                out.append(logits.numpy())
        return [layer.cross_fold is not None for layer in cache.layers], np.stack(out)

    for i in range(len(batch)):
        src = torch.from_numpy(batch[i:i + 1])
        folded, logits = logits_of_steps(src)
        assert all(folded), f"row {i}"
        greedy = torch_impl.greedy_decode(model, src, MAX_LEN)
        beam = torch_impl.beam_search(model, src, MAX_LEN, 3, 0.6)
        want_greedy = R.greedy_decode(oracle, batch[i:i + 1], MAX_LEN)
        want_beam = R.beam_search(oracle, batch[i:i + 1], MAX_LEN, 3, 0.6)
        np.testing.assert_array_equal(greedy.tokens, want_greedy.tokens, err_msg=f"row {i} greedy")
        np.testing.assert_array_equal(beam.tokens, want_beam.tokens, err_msg=f"row {i} beam")
        assert_close(greedy.log_probs, want_greedy.log_probs, bound, f"row {i} greedy log-probs")
        assert_close(beam.scores, want_beam.scores, bound, f"row {i} beam scores")
        with monkeypatch.context() as m:
            m.setattr(torch_impl.stacks, "folds_source", lambda *args: False)
            unfolded, want = logits_of_steps(src)
        assert not any(unfolded)
        assert_close(logits, want, bound, f"row {i} logits, folded against unfolded")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_folds_are_written_into_one_buffer_in_reading_order(dtype):
    """`torch_impl.cache.fold_buffers`: a CPU cache's folds (`CrossFold`, one a layer) are written
    by `fold_source` into one allocation, in the order a step reads them (scores kernel and bias,
    values kernel, output bias, layer after layer), contiguous, apart and 64-byte aligned, with the
    values a fold into tensors of its own gets, bit for bit: for a padded source, and for one with
    no key at all (its values kernel zeroed: the output is the output bias alone)."""
    from torch_impl.cache import prepare_mask
    config = tiny_configs()["tiny-post-standard"].replace(dtype=dtype, n_heads=2)  # 7 positions fold
    model = build(config, weights_for(config, 5))
    batch = sources(config, 5)
    padded = next(i for i in range(len(batch)) if 0 < (batch[i] == config.pad_id).sum() < batch.shape[1])
    empty = next(i for i in range(len(batch)) if (batch[i] == config.pad_id).all())
    for i in (padded, empty):
        src = torch.from_numpy(batch[i:i + 1])
        with torch.no_grad():
            mask = torch_impl.inputs.make_src_mask(src, config.pad_id)
            cache = model.init_cache(model.encode(src, mask), mask, 4)
            additive, keep = prepare_mask(mask, cache.layers[0].cross_key.dtype)
            alone = [layer.cross_attn.fold_source(c.cross_key, c.cross_value, additive, keep)
                     for layer, c in zip(model.decoder.layers, cache.layers)]
        read = [t for layer in cache.layers for t in layer.cross_fold[:4]]
        assert len({t.untyped_storage().data_ptr() for t in read}) == 1, f"row {i}"
        for t, after in zip(read, read[1:]):
            assert t.is_contiguous() and t.data_ptr() % 64 == 0, f"row {i}"
            assert t.data_ptr() + t.numel() * t.element_size() <= after.data_ptr(), f"row {i}"
        for layer, fold in zip(cache.layers, alone):
            for name, got, want in zip(fold._fields, layer.cross_fold, fold):
                if name != "heads":
                    assert (got.shape, got.dtype) == (want.shape, want.dtype), f"row {i} {name}"
                    assert torch.equal(got, want), f"row {i} {name}"
        assert (i == empty) == (not any(layer.cross_fold.values_kernel.any() for layer in cache.layers))


# 8 rows: packed on every CPU (`PACKED_MIN_ROWS`); at 1 a step is dense, and these tests would be
# skipped as if torch had no packed kernel.
PACKABLE = torch_impl.cache.step_layout(8, torch.device("cpu"), torch.float32) == torch_impl.cache.PACKED


@pytest.mark.parametrize("name", ["tiny-pre-annotated", "tiny-post-final-norm"])
def test_a_cached_step_calls_no_module_of_its_layers(name):
    """A cached step of a model as built runs its decoder layers on the weights and norms its
    cache keeps (`torch_impl.layers.DecoderLayer.step`): no module of a layer is called, since a
    module call between two streamed products costs cache misses (docs/performance.md, "A step's
    Python"). A model not as built (a hook on a layer's norm) calls its modules, the hook sees every
    step, and its logits are those of the model as built to float64's bound, step for step."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    config = tiny_configs()[name].replace(dtype="float64")
    model = build(config, weights_for(config, 0))
    src = torch.from_numpy(sources(config, 0)[:2])
    layers = {id(m) for m in model.decoder.layers.modules()}
    called = []

    def steps():
        with torch.inference_mode():
            memory, mask = model.encode(src), model._src_mask(src, None)
            cache = model.init_cache(memory, mask, 4)
            handle = register_module_forward_pre_hook(
                lambda module, args: called.append(type(module).__name__) if id(module) in layers else None)
            try:
                tokens, out = torch.full((2,), config.bos_id), []
                for _ in range(4):
                    logits, cache = model.decode_step(tokens, cache)
                    tokens = logits.argmax(-1)
                    out.append(logits)
            finally:
                handle.remove()
            return torch.stack(out).numpy()

    as_built = steps()
    assert called == []
    seen = []
    norm = model.decoder.layers[0].self_attn_norm
    hook = norm.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        hooked = steps()
    finally:
        hook.remove()
    assert len(seen) == 4 and "LayerNorm" in called and "Linear" in called
    assert_close(hooked, as_built, bound_for("float64", "torch:reference"), "logits, modules' steps")


def test_a_layers_keys_and_values_are_one_buffer_written_once_a_step():
    """`torch_impl.cache.LayerCache.self_keys_values`: a step writes its layer's new key and value
    into one buffer (one copy; one kernel of a CUDA graph's step), whose halves are the keys and
    values attention reads, also where the cache was made under no_grad and the steps run with
    gradients on (autograd refuses some views of a buffer written so); a layer cache handed other
    tensors as its keys and values (`updated`) refuses them, and one made of anything but such a
    buffer (the two halves given apart, as before) is refused, each naming the argument."""
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0))
    src = torch.from_numpy(sources(config, 0)[:2])
    cache = model.init_cache(model.encode(src), model._src_mask(src, None), 4)  # under no_grad inside
    tokens = torch.full((2,), config.bos_id)
    for _ in range(2):  # gradients on: the embedded tokens require grad
        logits, cache = model.decode_step(tokens, cache)
        tokens = logits.argmax(-1)
    for layer in cache.layers:
        both = layer.self_keys_values
        assert both.shape == (2, *layer.self_key.shape) and layer.self_key.data_ptr() == both.data_ptr()
        assert torch.equal(layer.self_key, both[0]) and torch.equal(layer.self_value, both[1])
        assert both[:, :, :, :2].any(dim=-1).all() and not both[:, :, :, 2:].any()  # positions 0, 1 written
    layer = cache.layers[0]
    with pytest.raises(ValueError, match=r"self_key, self_value: expected this cache's own buffers, "
                                         r"written in place, got other tensors"):
        layer.updated(layer.self_key.clone(), layer.self_value)
    with pytest.raises(ValueError, match=r"self_keys_values: expected the keys and values in one tensor of "
                                         r"shape \(2, N, H, capacity, d_k\), got shape \(2, 4, 4, 4\)$"):
        torch_impl.cache.LayerCache(layer.self_key, layer.cross_key, layer.cross_value, layer.weights)
    with pytest.raises(TypeError, match=r"self_keys_values: expected a torch.Tensor, got ndarray$"):
        torch_impl.cache.LayerCache(np.zeros((2, 2, 4, 4, 4)), layer.cross_key, layer.cross_value, layer.weights)


def test_a_cache_made_under_inference_mode_is_written_under_it_or_refused_by_name():
    """A cache made under ``torch.inference_mode()`` holds inference tensors, which torch writes
    only in that mode: `decode_step` and `reorder_beams` outside it refuse with an error naming
    ``cache`` (torch's own names nothing) before writing anything; inside it they step as a cache
    made under no_grad does, bit for bit; a cache made under no_grad serves both modes."""
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0))
    src = torch.from_numpy(sources(config, 0)[:1])
    mask = model._src_mask(src, None)
    with torch.inference_mode():  # one source, two beams: rows 0 and 1 may take each other's
        inferred = model.init_cache(model.encode(src, mask), mask, 4, beams=2)
    with torch.no_grad():
        plain = model.init_cache(model.encode(src, mask), mask, 4, beams=2)
    tokens = torch.full((2,), config.bos_id)
    before = [layer.self_keys_values.clone() for layer in inferred.layers]
    message = (r"^cache: expected a call under torch.inference_mode\(\), in which the cache was made "
               r"\(torch writes its tensors only there\), got one outside it; or make the cache under "
               r"torch.no_grad\(\)$")
    for mode in (torch.no_grad, torch.enable_grad):
        with mode(), pytest.raises(ValueError, match=message):
            model.decode_step(tokens, inferred)
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        inferred.reorder_beams(torch.tensor([0, 1]))
    assert inferred.length == 0  # nothing written, nothing advanced
    for layer, old in zip(inferred.layers, before):
        assert torch.equal(layer.self_keys_values, old)
    with torch.inference_mode():
        got, inferred = model.decode_step(tokens, inferred)
        inferred.reorder_beams(torch.tensor([1, 0]))
    with torch.inference_mode():  # a no_grad cache under inference_mode, then outside it
        want, plain = model.decode_step(tokens, plain)
    with torch.no_grad():
        plain.reorder_beams(torch.tensor([1, 0]))
        model.decode_step(tokens, plain)
    assert torch.equal(got, want)
    assert inferred.length == 1 and plain.length == 2


def test_decode_step_and_reorder_beams_take_ids_on_another_device():
    """Token ids and beam rows on the CPU for a cache on a GPU are moved to the cache's device, as
    `forward` moves its ids to the model's (tf_impl places them itself; docs/design.md, convention
    12): the same logits and cache as with ids on the GPU, where torch's own gather and
    index_select would refuse the mix."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0)).to("cuda")
    src = torch.from_numpy(sources(config, 0)[:1]).cuda()
    mask = model._src_mask(src, None)
    logits, caches = [], []
    with torch.no_grad():
        for device in ("cuda", "cpu"):
            cache = model.init_cache(model.encode(src, mask), mask, 4, beams=2)
            out, cache = model.decode_step(torch.tensor([config.bos_id] * 2, device=device), cache)
            cache.reorder_beams(torch.tensor([1, 0], device=device))
            out, cache = model.decode_step(torch.tensor([5, 6], device=device), cache)
            logits.append(out)
            caches.append(cache)
    assert logits[1].device.type == "cuda" and torch.equal(logits[0], logits[1])
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(a.self_keys_values, b.self_keys_values)


def test_the_model_calls_take_tensors_on_another_device():
    """forward, encode, decode and init_cache given ids, masks and memory on the CPU for a model on
    a GPU copy them to the model's device (docs/design.md, convention 12): the same outputs, on the
    GPU, as with every input there, where torch's own embedding and attention would refuse the
    mix."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0)).to("cuda").eval()
    src = torch.from_numpy(sources(config, 0))
    tgt = torch.full((src.shape[0], 3), config.bos_id)
    src_mask = torch_impl.inputs.make_src_mask(src, config.pad_id)
    tgt_mask = torch_impl.inputs.make_tgt_mask(tgt, config.pad_id)
    outputs = []
    with torch.no_grad():
        for device in ("cuda", "cpu"):
            s, t, sm, tm = (x.to(device) for x in (src, tgt, src_mask, tgt_mask))
            memory = model.encode(s, sm)
            cache = model.init_cache(memory.to(device), sm, 4)
            outputs.append([model(s, t), model(s, t, sm, tm), memory,
                            model.decode(t, memory.to(device), sm, tm),
                            model.decode_step(t[:, 0], cache)[0]])
    for on_gpu, from_cpu in zip(*outputs):
        assert from_cpu.device.type == "cuda" and torch.equal(on_gpu, from_cpu)


@pytest.mark.parametrize("dtype, rows", [("float64", 5), ("float32", 1), ("float32", 5)])
def test_step_weights_follow_the_parameters(dtype, rows):
    """The cached step's prepared weights (`torch_impl.cache.StepWeights`, in each layout) are
    kept between decodes only while no parameter changes: new weights imported, or an in-place
    update (an optimizer step), give the decode of a fresh model holding those weights."""
    config = tiny_configs()["tiny-post-standard"].replace(dtype=dtype)
    model = build(config, weights_for(config, 0))
    src = sources(config, 0)[:rows]
    first = torch_impl.greedy_decode(model, src, MAX_LEN)
    assert model._step_weights(rows) is model._step_weights(rows)  # kept while nothing changes
    kept = model._step_weights(rows)
    with torch.no_grad():  # the encoder alone (its fine-tuning): nothing the step reads
        model.encoder.layers[0].ffn.inner.weight.add_(1.0)
    assert model._step_weights(rows) is kept
    with torch.no_grad():  # the generator's bias, in place (its version counter moves): made again
        model.generator.bias.add_(0.0)
    assert model._step_weights(rows) is not kept
    model.import_weights(weights_for(config, 1))
    np.testing.assert_array_equal(torch_impl.greedy_decode(model, src, MAX_LEN).tokens,
                                  torch_impl.greedy_decode(build(config, weights_for(config, 1)), src,
                                                           MAX_LEN).tokens)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0)  # in place: the version counters move
    fresh = build(config, {k: -v for k, v in weights_for(config, 1).items()})
    for x, y in zip(torch_impl.beam_search(model, src, MAX_LEN, 2), torch_impl.beam_search(fresh, src, MAX_LEN, 2)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first.tokens, torch_impl.greedy_decode(model, src, MAX_LEN).tokens)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_steps_dense_kernels_share_one_buffer_in_reading_order(monkeypatch, dtype):
    """On the CPU the kept step weights in a layout of plain tensors (float32 at one row with
    `PACKED_MIN_ROWS` at 2, its value; float16's `DENSE_OUT_IN` at one row) are views
    of one buffer (`torch_impl.cache.in_one_buffer`): in the order a step reads them, apart and
    64-byte aligned, each with the shape, strides and values `lay_out_weights` gives alone; the
    cross-attention's key/value kernel, applied once per source, is not among them. A decode on
    them gives the same bits as on the kernels laid out apart."""
    from torch_impl import cache
    from torch_impl.cache import StepWeights, lay_out_weights, step_layout
    from torch_impl.precision import set_precision
    monkeypatch.setattr(cache, "PACKED_MIN_ROWS", 2)
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0)).eval()
    set_precision(model, dtype)
    half = None if dtype == "float32" else getattr(torch, dtype)
    layout = step_layout(1, torch.device("cpu"), getattr(torch, dtype))
    assert layout in (cache.DENSE, cache.DENSE_OUT_IN)
    with torch.autocast("cpu", dtype=half, enabled=half is not None):
        layers, _ = model._step_weights(1)
    alone = [lay_out_weights(w, layout, half) for w in model.decoder.step_weights()]
    names = [name for name in StepWeights._fields if not name.startswith("cross_kv")]
    read = [getattr(w, name) for w in layers for name in names]
    assert len({t.untyped_storage().data_ptr() for t in read}) == 1
    for t, after in zip(read, read[1:]):
        assert t.data_ptr() % 64 == 0 and t.data_ptr() + t.numel() * t.element_size() <= after.data_ptr()
    assert layers[0].cross_kv_kernel.untyped_storage().data_ptr() != read[0].untyped_storage().data_ptr()
    for w, a in zip(layers, alone):
        for name in StepWeights._fields:
            got, want = getattr(w, name), getattr(a, name)
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), name
            assert torch.equal(got, want), name
    src = sources(config, 0)[:1]
    together = torch_impl.greedy_decode(model, src, MAX_LEN)  # one row: the layout above
    fresh = build(config, weights_for(config, 0)).eval()
    set_precision(fresh, dtype)
    monkeypatch.setattr(torch_impl.model, "in_one_buffer", lambda layers, device: layers)
    for x, y in zip(together, torch_impl.greedy_decode(fresh, src, MAX_LEN)):
        np.testing.assert_array_equal(x, y)
    if PACKABLE:  # oneDNN's packed tensors stay as oneDNN made them
        packed = [lay_out_weights(w, cache.PACKED) for w in model.decoder.step_weights()]
        assert cache.in_one_buffer(packed, torch.device("cpu")) is packed


@pytest.mark.skipif(not PACKABLE, reason="this torch build has no oneDNN packed-weight linear")
def test_step_layouts_by_rows(monkeypatch):
    """float32 on the CPU multiplies the oneDNN-packed kernels from `PACKED_MIN_ROWS` rows (2, on
    every CPU: `torch_impl.cache.step_layout`, measured: benchmarks/step_layouts.py), the dense
    ``(in, out)`` ones (addmm) below it, and the setting moves the line (1: packed at one row
    too); float64, CUDA and an unknown row count the dense ones. Both products, the feed-forward's
    fused rectifier included, are within the worst-case rounding error of a float32 dot product
    (Higham's ``gamma_n``: ``n * u`` times the sum of the terms' magnitudes), not a tuned
    tolerance; the rectifier itself is exact."""
    from torch_impl import cache
    from torch_impl.cache import DENSE, PACKED, dense, lay_out, step_layout
    cpu = torch.device("cpu")
    assert cache.PACKED_MIN_ROWS == 2
    for min_rows, want in [(2, [DENSE, PACKED, PACKED, PACKED, DENSE]), (1, [PACKED, PACKED, PACKED, PACKED, DENSE])]:
        monkeypatch.setattr(cache, "PACKED_MIN_ROWS", min_rows)
        assert [step_layout(n, cpu, torch.float32) for n in (1, 2, 3, 8, None)] == want, min_rows
    assert step_layout(8, cpu, torch.float64) == DENSE
    assert [step_layout(n, cpu, torch.float16) for n in (1, 2, 8, None)] == [
        cache.DENSE_OUT_IN, cache.WIDENED, cache.WIDENED, DENSE]
    assert step_layout(8, torch.device("cuda"), torch.float16) == DENSE
    bf16 = PACKED if torch.ops.mkldnn._is_mkldnn_bf16_supported() else DENSE  # AVX512-BF16, AMX
    assert [step_layout(n, cpu, torch.bfloat16) for n in (1, 8, None)] == [bf16, bf16, DENSE]
    assert step_layout(8, torch.device("cuda"), torch.float32) == DENSE
    g = torch.Generator().manual_seed(0)
    kernel, bias = torch.randn(96, 40, generator=g), torch.randn(40, generator=g)
    for rows in (1, 3, 8, 33):
        x = torch.randn(rows, 1, 96, generator=g)
        exact = (x.double() @ kernel.double() + bias.double()).numpy()
        magnitude = (x.double().abs() @ kernel.double().abs() + bias.double().abs()).numpy()
        bound = (96 + 1) * 2.0 ** -24 * magnitude  # 96 products and the bias, float32's u
        for layout in (DENSE, cache.DENSE_OUT_IN, PACKED):
            y = dense(x, lay_out(kernel, layout), bias)
            assert y.shape == (rows, 1, 40) and y.dtype == torch.float32
            assert (np.abs(y.double().numpy() - exact) <= bound).all(), layout
            rectified = dense(x, lay_out(kernel, layout), bias, relu=True)
            assert torch.equal(rectified, y.relu()), layout
        # float16's product, in either float16 layout: float16 operands, a float32 sum, the result
        # rounded to float16 (half an ulp: 2**-11 of it), as torch's own float16 addmm rounds
        k16, b16, x16 = kernel.half(), bias.half(), x.half()
        exact = (x16.double() @ k16.double() + b16.double()).numpy()
        sum_error = (96 + 1) * 2.0 ** -24 * (x16.double().abs() @ k16.double().abs()
                                              + b16.double().abs()).numpy()
        for layout in (cache.DENSE_OUT_IN, cache.WIDENED):
            with torch.autocast("cpu", dtype=torch.float16):  # as a float16 step runs
                y = dense(x, lay_out(k16, layout), b16)  # float32 rows, rounded for the product
                rectified = dense(x, lay_out(k16, layout), b16, relu=True)
            assert y.dtype == torch.float16, layout
            assert (np.abs(y.double().numpy() - exact) <= 2.0 ** -11 * (np.abs(exact) + sum_error)
                    + sum_error).all(), layout
            assert torch.equal(rectified, y.relu()), layout


@pytest.mark.skipif(not PACKABLE, reason="this torch build has no oneDNN packed-weight linear")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_encoder_pass_of_a_decode_matches_the_oracle(variant):
    """A float32 decode on the CPU encodes its source on oneDNN-packed kernels, query, key and value
    from one product (`Transformer._encode_for_decoding`, `torch_impl.stacks.Encoder.infer`): its
    memory agrees with the float64 oracle's within the bound `encode` meets (``float32
    torch:reference``), a padded row and an all-padding row included; the packed kernels are made
    once and kept."""
    config = VARIANTS[variant].replace(dtype="float32")
    weights = weights_for(config, 0)
    model = build(config, weights)
    src = sources(config, 0)  # rows of 7, 5, 2, 1 and 0 tokens
    want = R.encode({name: w.astype(np.float64) for name, w in weights.items()},
                    config.replace(dtype="float64"), src)
    src_t = torch.from_numpy(src)
    with torch.inference_mode():
        memory = model._encode_for_decoding(src_t, model._src_mask(src_t, None))
    packed = torch_impl.cache.PACKED
    assert memory.dtype == torch.float32 and model._encoder_weights(packed) is model._encoder_weights(packed)
    assert_close(memory.numpy(), want, bound_for("float32", "torch:reference"), f"{variant} memory")


def test_a_model_that_decoded_still_pickles_and_copies():
    """The prepared weights are a cache outside the model's state: ``torch.save(model)`` and
    ``copy.deepcopy`` work after a decode (oneDNN's packed tensors alone could not be pickled),
    and the copy decodes as the original."""
    import copy
    import io
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 0))
    src = sources(config, 0)
    before = torch_impl.greedy_decode(model, src, MAX_LEN)
    with torch.no_grad():
        model(torch.from_numpy(src), torch.from_numpy(src[:, :3]))  # the forward's kept weights too
    assert "_prepared_weights" in model.generator.__dict__
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert "_prepared_weights" not in other.__dict__ | other.generator.__dict__
        for x, y in zip(before, torch_impl.greedy_decode(other, src, MAX_LEN)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", ["tiny-pre-annotated", "tiny-post-standard"])
def test_a_step_at_a_tensor_position_is_the_eager_step(variant, dtype, device):
    """What a CUDA graph replays (`torch_impl.graphs`: the position a device tensor, the whole
    buffer masked to the filled positions) gives the eager step's logits, step by step, within the
    dtype's bound of the oracle; and writes the same keys and values."""
    config = tiny_configs()[variant].replace(dtype=dtype)
    model = build(config, weights_for(config, 4), device)
    src = torch.from_numpy(sources(config, 4)).to(device)  # padded, an all-padding row
    tokens = torch.from_numpy(np.random.default_rng(4).integers(3, config.tgt_vocab, (src.shape[0], 6)))
    tokens = tokens.to(device)
    bound = bound_for(dtype, "torch:reference")
    with torch.inference_mode():
        mask = torch_impl.inputs.make_src_mask(src, config.pad_id)
        eager = model.init_cache(model.encode(src), mask, 6)
        graphed = model.init_cache(model.encode(src), mask, 6)
        position = torch.zeros((), dtype=torch.int64, device=device)
        for t in range(6):
            want, eager = model.decode_step(tokens[:, t], eager)
            position.fill_(t)
            got = model._step_logits(tokens[:, t], graphed, position)
            assert_close(got.cpu().numpy(), want.cpu().numpy(), bound, f"step {t}")
        for a, b in zip(graphed.layers, eager.layers):
            assert_close(a.self_key.cpu().numpy(), b.self_key.cpu().numpy(), bound, "keys")
            assert_close(a.self_value.cpu().numpy(), b.self_value.cpu().numpy(), bound, "values")


class _Replayed:
    """A captured CUDA graph's stand-in on the CPU: ``replay`` runs the recorded work again and
    writes its result into the output the capture returned, as a replay rewrites a graph's output
    in place. Everything else a graph reads and writes (the cache, the loop's state, the position)
    is the same tensors either way, so the graph path's own logic runs on a CPU-only machine."""

    def __init__(self, work, output: torch.Tensor):
        self.work, self.output = work, output

    def replay(self) -> None:
        self.output.copy_(self.work())


def _capture_on_cpu(work, device):
    """`torch_impl.graphs._capture` without CUDA: the two warm-up runs, then the recording run."""
    for _ in range(2):
        work()
    output = work()
    return _Replayed(work, output), output


def _graphs_on_cpu(monkeypatch) -> list:
    """Cached decoding on the CPU through `torch_impl.graphs` with `_Replayed` graphs (while
    ``graphs.ENABLED``); returns the list that every capture appends its device to."""
    from torch_impl import graphs
    captures = []
    monkeypatch.setattr(graphs, "_capture", lambda work, where: captures.append(where) or
                        _capture_on_cpu(work, where))
    monkeypatch.setattr(graphs, "usable", lambda where: graphs.ENABLED)
    _lagged_on_cpu(monkeypatch)  # greedy's graph loop reads a step late on CUDA: here too
    return captures


def _assert_same_decodes(got, want, bound: float) -> None:
    """Each result of ``got`` (greedy's, beam search's, ...) within ``bound`` of ``want``'s, field by
    field (beam search's all_* are None without return_all)."""
    for g, w in zip(got, want):
        for x, y in zip(g, w):
            if y is not None:
                np.testing.assert_allclose(x, y, atol=bound)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_graphed_decoding_equals_the_eager_step(precision, device, monkeypatch):
    """Cached decoding on CUDA replays one CUDA graph a step (`torch_impl.graphs`): greedy (step and
    selection in one graph) and beam search (its cache reordered in place between replays) give
    the eager step's tokens, and log-probs within the bound of the precision. On the CPU the same
    code runs with each replay a rerun of the recorded work (`_Replayed`), so a machine without a
    GPU still tests everything but the recording itself."""
    from torch_impl import graphs
    from torch_impl.precision import set_precision
    captures = _graphs_on_cpu(monkeypatch) if device == "cpu" else []
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 2), device)
    set_precision(model, precision)
    src = torch.from_numpy(sources(config, 2)).to(device)
    bound = bound_for(precision, "torch:reference").rtol
    results = {}
    for enabled in (True, False):
        monkeypatch.setattr(graphs, "ENABLED", enabled)
        results[enabled] = (torch_impl.greedy_decode(model, src, MAX_LEN),
                            torch_impl.beam_search(model, src, MAX_LEN, 3, 0.6))
    assert device == "cuda" or len(captures) == 2  # greedy's graph and beam search's step
    (g, b), (eg, eb) = results[True], results[False]
    np.testing.assert_array_equal(g.tokens, eg.tokens)
    np.testing.assert_allclose(g.log_probs, eg.log_probs, atol=bound)
    np.testing.assert_array_equal(b.tokens, eb.tokens)
    np.testing.assert_allclose(b.scores, eb.scores, atol=bound)


def test_a_decode_of_the_same_shape_replays_the_kept_graph(monkeypatch):
    """A model keeps its latest graph of each kind (`torch_impl.graphs._kept`): a later decode of
    the same shape refills it with its own source and replays it without recording again; a decode
    of another shape, or after the weights change, records anew. Every result equals the eager
    step's, whatever ran before it (the stand-in graphs of `_Replayed`, on the CPU)."""
    from torch_impl import graphs
    captures = _graphs_on_cpu(monkeypatch)
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 2))
    a, b = (torch.from_numpy(sources(config, seed)) for seed in (2, 3))  # same shape, other ids
    assert a.shape == b.shape and not torch.equal(a, b)

    def decodes(src, max_len=MAX_LEN):
        return torch_impl.greedy_decode(model, src, max_len), torch_impl.beam_search(model, src, max_len, 3)

    def eager(src, max_len=MAX_LEN):
        monkeypatch.setattr(graphs, "ENABLED", False)
        try:
            return decodes(src, max_len)
        finally:
            monkeypatch.setattr(graphs, "ENABLED", True)

    bound = bound_for(config.dtype, "torch:reference").rtol
    want_a, want_b = eager(a), eager(b)
    for src, want in [(a, want_a), (b, want_b), (a, want_a)]:
        _assert_same_decodes(decodes(src), want, bound)
    assert len(captures) == 2  # greedy's and beam search's, once each for three decodes
    _assert_same_decodes(decodes(a, MAX_LEN - 1), eager(a, MAX_LEN - 1), bound)  # another capacity: recorded anew
    assert len(captures) == 4
    model.import_weights(weights_for(config, 5))  # new weights: the kept graphs read the old ones
    _assert_same_decodes(decodes(a, MAX_LEN - 1), eager(a, MAX_LEN - 1), bound)
    assert len(captures) == 6
    assert copy.deepcopy(model).__dict__.get("_graphs") is None


def test_a_kept_graph_refills_the_folded_source(monkeypatch):
    """A kept graph (`torch_impl.graphs._kept`) reads the cross-attention fold of the decode that
    recorded it (`torch_impl.cache.CrossFold`: one item's short source), so a later decode of the
    same shape refills it, as it does the keys and values; each result the eager step's. A CUDA
    cache does not fold (`folds_source`), but the graphs hold for any cache: tested with the
    stand-in graphs of `_Replayed` on the CPU, where the cache folds."""
    from torch_impl import graphs
    captures = _graphs_on_cpu(monkeypatch)
    config = tiny_configs()["tiny-post-standard"].replace(n_heads=2)  # 7 positions fold at 2 heads
    model = build(config, weights_for(config, 2))
    a, b = (torch.from_numpy(sources(config, seed)[:1]) for seed in (2, 3))  # one item each
    assert a.shape == b.shape and not torch.equal(a, b)
    bound = bound_for(config.dtype, "torch:reference").rtol

    def decodes(src):
        return torch_impl.greedy_decode(model, src, MAX_LEN), torch_impl.beam_search(model, src, MAX_LEN, 3)

    monkeypatch.setattr(graphs, "ENABLED", False)
    want = {id(src): decodes(src) for src in (a, b)}
    monkeypatch.setattr(graphs, "ENABLED", True)
    for src in (a, b, a):
        _assert_same_decodes(decodes(src), want[id(src)], bound)
    assert len(captures) == 2  # greedy's and beam search's, once each for three decodes
    assert all(layer.cross_fold is not None for kind in ("greedy", "step")
               for layer in model._graphs[kind].cache.layers)


class _NaNAt:
    """A stub step on CUDA: uniform logits, NaN in row 0 from step ``bad`` on (None: never), EOS
    best in every row from step ``end`` on."""

    def __init__(self, bad, end: int, vocab: int = 7, eos: int = 2):
        self.bad, self.end, self.vocab, self.eos, self.dtype = bad, end, vocab, eos, torch.float32
        self.calls = 0

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        self.calls += 1
        logits = torch.zeros(prefixes.shape[0], self.vocab, device=prefixes.device)
        if t >= self.end:
            logits[:, self.eos] = 1.0
        if self.bad is not None and t >= self.bad:
            logits[0] = float("nan")
        return logits, state

    def reorder(self, state, rows):
        return state


def _lagged_on_cpu(monkeypatch) -> None:
    """Greedy's loops (eager and graphed) read each step's flags one step late on the CPU too, as
    on CUDA (`torch_impl.search._LaggedReads` with ``lag=True``: plain copies, no pinned memory
    or events), so that a machine without a GPU runs the lagged loop's logic."""
    from torch_impl import search
    lagged = search._LaggedReads
    monkeypatch.setattr(search, "_LaggedReads", lambda where: lagged(where, lag=True))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_greedy_reads_a_step_late_and_still_names_the_bad_step(device, monkeypatch):
    """On CUDA greedy reads step t's flags at step t + 1 (`torch_impl.search._LaggedReads`; on the
    CPU forced, `_lagged_on_cpu`): a NaN step still raises naming its own step, and the results
    are the one-read-a-step results, with one step more run after every row finished."""
    from shared.decoding import bad_step_message
    from torch_impl import search
    at_once = _NaNAt(None, 4)
    want = search.greedy_search(at_once, 2, 8, 1, 2, 0, device="cpu")
    assert at_once.calls == 5  # each step read at once: steps 0-4, the last one EOS
    if device == "cpu":
        _lagged_on_cpu(monkeypatch)
    with pytest.raises(ValueError, match=re.escape(bad_step_message(3))):
        search.greedy_search(_NaNAt(3, 99), 2, 8, 1, 2, 0, device=device)
    lagged = _NaNAt(None, 4)
    got = search.greedy_search(lagged, 2, 8, 1, 2, 0, device=device)
    assert lagged.calls == 6  # step 4's flags were read at step 5, which had run
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    # each device's own logsumexp: the same log-probs to float32 rounding
    np.testing.assert_allclose(got.log_probs, want.log_probs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_graph_step_launches_its_masks_once_and_no_conversions(precision):
    """What a CUDA graph replays is one kernel per operation (`benchmarks/step_ops.py` counts
    them): the step makes its position mask once for every layer (one ``arange``), hands SDPA
    masks already in its additive form (no ``where`` converting a bool mask per layer), writes each
    layer's new key and value with one kernel (`torch_impl.cache.LayerCache.self_keys_values`), and, where
    its products are oneDNN-packed, runs the feed-forward rectifier inside the product (no
    ``relu``)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "step_ops", Path(__file__).resolve().parent.parent / "benchmarks" / "step_ops.py")
    step_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_ops)
    ops = {name: n for (name, view), n in step_ops.step_ops("tiny", 2, precision, "cpu").items() if not view}
    layers = TransformerConfig.preset("tiny").n_decoder_layers
    assert ops["arange"] == 1, ops
    assert "where" not in ops and "le" not in ops, ops
    assert ops["index_copy_"] == layers, ops  # each layer's key and value in one write, in place
    from torch_impl.cache import PACKED, step_layout
    if step_layout(2, torch.device("cpu"), getattr(torch, precision)) == PACKED:
        assert not any(name.startswith("relu") for name in ops), ops


def test_a_wrapped_model_is_refused_naming_what_to_pass():
    """``torch.compile(model)`` or ``nn.DataParallel(model)`` given to a decoder: refused, naming
    the attribute that holds the model (decoding runs its own steps, never the wrapper's forward)."""
    config = tiny_configs()["tiny-post-standard"]
    model = build(config, weights_for(config, 2))
    src = sources(config, 2)
    for wrapper, attribute in ((torch.compile(model), "_orig_mod"), (torch.nn.DataParallel(model), "module")):
        with pytest.raises(TypeError, match=rf"model: expected a torch_impl.Transformer, got a "
                                            rf"{type(wrapper).__name__} wrapping one: pass model.{attribute} "):
            torch_impl.greedy_decode(wrapper, src, MAX_LEN)
        with pytest.raises(TypeError, match=f"pass model.{attribute} "):
            torch_impl.beam_search(wrapper, src, MAX_LEN)


@pytest.mark.parametrize("position, error", [(-1, ValueError), (2.7, TypeError), (4, ValueError)])
def test_a_layer_step_at_a_position_outside_the_cache_is_refused(position, error):
    """`DecoderLayer.step`'s fast path (the cache keeps the weights; it calls no `extend`) wrote
    -1 into the last slot as `extend` did; it checks the position as `extend` does now, before any
    write."""
    config = TransformerConfig.preset("tiny", dropout=0.0)
    model = build(config, weights_for(config, 0), "cpu")
    src = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():
        cache = model.init_cache(model.encode(src), torch_impl.inputs.make_src_mask(src, config.pad_id), 4)
        layer = cache.layers[0]
        assert layer.weights  # the fast path
        with pytest.raises(error, match=r"^position: expected an int in \[0, 4\) \(the cache's capacity\), "
                                        rf"got {position}$"):
            model.decoder.layers[0].step(torch.ones(1, config.d_model), layer, position, cache.src_mask,
                                         cache.src_keep)
        assert not layer.self_key.any() and not layer.self_value.any()
        mask = torch_impl.cache.filled_mask(4, torch.tensor(1), layer.self_key.dtype)  # a tensor position's
        with pytest.raises(ValueError, match=r"^mask: expected None with an int position \(1: "):
            model.decoder.layers[0].step(torch.ones(1, config.d_model), layer, 1, cache.src_mask,
                                         cache.src_keep, mask)
        assert not layer.self_key.any() and not layer.self_value.any()

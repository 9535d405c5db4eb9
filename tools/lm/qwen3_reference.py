#!/usr/bin/env python3
"""Reference fixtures and CPU timings for the Rust Qwen3 causal LM (crates/train).

The Rust crate re-implements Hugging Face's ``Qwen3ForCausalLM`` (forward, loss and
backward). This script is the other side of that comparison. It is for developers:
CI never runs it, and CI needs no Python. What it writes under
``crates/train/tests/fixtures/qwen3`` is committed, and the Rust tests read those
files. Everything is built from configs with fixed seeds. Nothing is downloaded:
``HF_HUB_OFFLINE`` is forced on before transformers is imported.

Subcommands:

    # Fixtures: two tiny random models (tied and untied embeddings), each saved
    # with save_pretrained (config.json + model.safetensors), plus
    # expected.safetensors (input_ids, logits, loss, selected gradients)
    # and versions.json. Then the LoRA case below, which needs peft and the tied
    # model (regenerating tied without lora would leave lora stale).
    python3 tools/lm/qwen3_reference.py parity --out crates/train/tests/fixtures/qwen3

    # Only the LoRA case: a PEFT adapter on the tied model, written to <out>/lora.
    # The base is <out>/tied (which must exist and match build_tiny_model); lora/
    # holds no copy of it. Adds "peft" and "lora" keys to <out>/versions.json and
    # leaves every other key as it is.
    python3 tools/lm/qwen3_reference.py lora --out crates/train/tests/fixtures/qwen3

    # PyTorch CPU speed of forward+backward (optionally + AdamW) on a random model
    # built from any Hugging Face config.json. Prints one JSON line.
    python3 tools/lm/qwen3_reference.py bench --config path/to/config.json \
        --batch 8 --seq 128 --threads 1 --steps 10 [--optimizer adamw]

    # Token ids of a text prefix, to compare with a Rust tokenizer. Prints JSON.
    python3 tools/lm/qwen3_reference.py tokenizer --tokenizer-json path/to/tokenizer.json \
        --text-file crates/train/data/austen/emma.txt --max-chars 2000

Written against torch 2.15 and transformers 5.24. In transformers 5, rope theta is
stored as ``config.json["rope_parameters"]["rope_theta"]``. Older configs have a
top-level ``rope_theta``, which transformers still reads and moves there. If
``Qwen3Config`` is given neither, theta silently becomes 10000, not Qwen3's 1e6.

``parity`` also checks its own output. The tied file must omit ``lm_head.weight``
and the untied one must have it. ``from_pretrained`` on the saved folder must
reproduce the logits. An independent plain-torch forward, built from config.json
and model.safetensors alone (``manual_forward``, a spec for the Rust port), must
reproduce the logits, the loss and every stored gradient.

The LoRA case (``lora/``, peft 0.21.2): ``get_peft_model`` with
``LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")`` on the tied model. Every
lora_A and lora_B is re-drawn from a seeded generator (PEFT's zero B would make the
adapter a no-op and A's gradient zero). ``lora/`` holds:

* ``adapter_config.json`` and ``adapter_model.safetensors``, as PEFT's
  ``save_pretrained`` writes them (README.md dropped). Tensor names are
  ``base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight`` and
  ``base_model.model.model.layers.{i}.mlp.down_proj.lora_{A,B}.weight``; A is
  [r, in], B is [out, r]; no ``.default.`` adapter name in them.
* ``expected.safetensors``: input_ids, logits and loss of the PEFT model, and
  ``grad.<adapter tensor name>`` for every lora_A and lora_B (base frozen).
* ``merged.safetensors``: ``merge_and_unload()``'s weights of the adapted linears
  only, ``model.layers.{i}.<module>.weight`` = W + (lora_alpha / r) * B @ A.

Its self-checks: the adapter file holds exactly the trainable tensors; the base
built here equals ``tied/model.safetensors``; ``PeftModel.from_pretrained`` on the
saved folder reproduces the logits; ``manual_forward`` on ``tied/`` with each
adapted W replaced by W + (alpha / r) * B @ A reproduces the logits (1e-5), the
loss and every adapter gradient; the merged weights equal that sum.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

# No network, ever: everything is built locally from configs.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()

# --------------------------------------------------------------------------------------
# Parity fixtures
# --------------------------------------------------------------------------------------

#: Seed of the torch.Generator that re-initialises the weights (same for both cases).
WEIGHT_SEED = 1234
#: Seed of the torch.Generator that draws the input ids (same ids for both cases).
INPUT_SEED = 5678
#: Std of every linear and embedding weight. HF's 0.02 gives near-uniform logits.
#: 0.15 gives logits with a spread of a few units.
INIT_STD = 0.15
#: RMSNorm weights are 1 + NORM_JITTER * N(0, 1), so swapping two norms would show.
NORM_JITTER = 0.2
#: Shape of the fixed input ids.
BATCH, SEQ = 2, 16

#: The tiny Qwen3 used by the fixtures. The tie_word_embeddings flag is added per case.
TINY_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    # transformers 5 spelling. A top-level rope_theta=... kwarg is also accepted and
    # moved into this dict; without either, theta would default to 10000.
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    max_position_embeddings=128,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    dtype="float32",
)

#: Case name -> (tie_word_embeddings, overrides of TINY_CONFIG). The untied case has
#: head_dim 32, so q_proj's output (4 x 32 = 128) differs from hidden_size (64): a port
#: that derives head_dim from hidden/heads, or assumes q_proj is square, fails it.
CASES = {"tied": (True, {}), "untied": (False, {"head_dim": 32})}

#: Parameters whose gradients go into expected.safetensors, as "grad.<name>".
GRAD_NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.q_norm.weight",
    "model.layers.1.self_attn.k_norm.weight",
    "model.layers.1.self_attn.o_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.1.post_attention_layernorm.weight",
    "model.norm.weight",
]
UNTIED_EXTRA_GRADS = ["lm_head.weight"]


def build_tiny_model(tied: bool, overrides: dict | None = None) -> Qwen3ForCausalLM:
    """A float32, eager-attention Qwen3ForCausalLM with the discriminating re-init."""
    config = Qwen3Config(**{**TINY_CONFIG, **(overrides or {})}, tie_word_embeddings=tied)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert model.config.rope_parameters["rope_theta"] == 1_000_000.0, model.config.rope_parameters
    reinit_(model, seed=WEIGHT_SEED)

    same = model.lm_head.weight is model.model.embed_tokens.weight
    if tied:
        assert same, "tied case: lm_head.weight must be embed_tokens.weight"
    else:
        assert not same and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, (name, p.dtype)
    return model


@torch.no_grad()
def reinit_(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter in place from one seeded generator.

    The parameters are visited in ``named_parameters()`` order. That order
    de-duplicates, so a tied lm_head is drawn once, through embed_tokens. Filling
    in place with ``copy_`` keeps the tie. Each 2-D weight (linear or embedding)
    gets N(0, INIT_STD). Each 1-D weight is an RMSNorm weight (the model has no
    biases) and gets 1 + NORM_JITTER * N(0, 1).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if p.ndim == 2:
            p.copy_(noise * INIT_STD)
        elif p.ndim == 1 and name.endswith("norm.weight"):
            p.copy_(1.0 + NORM_JITTER * noise)
        else:
            raise AssertionError(f"unexpected parameter {name} {tuple(p.shape)}")


def fixed_input_ids(vocab_size: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(INPUT_SEED)
    return torch.randint(0, vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)


def manual_forward(weights: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor):
    """Qwen3 forward and loss in plain torch, from config.json and model.safetensors.

    This is an independent check of the fixtures, and an executable spec for the
    Rust port. It must match HF to float32 rounding.
    """
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_parameters"]["rope_theta"]
    B, T = ids.shape

    def rms(x, w):  # computed in float32, then multiplied by the weight
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rot_half(x):
        return torch.cat((-x[..., hd // 2 :], x[..., : hd // 2]), dim=-1)

    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))  # [hd/2]
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]: halves duplicated, not interleaved
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)  # 0 on/below diagonal

    x = weights["model.embed_tokens.weight"][ids]  # [B, T, H]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, weights[p + "input_layernorm.weight"])
        q = (h @ weights[p + "self_attn.q_proj.weight"].T).view(B, T, nh, hd)
        k = (h @ weights[p + "self_attn.k_proj.weight"].T).view(B, T, nkv, hd)
        v = (h @ weights[p + "self_attn.v_proj.weight"].T).view(B, T, nkv, hd)
        q = rms(q, weights[p + "self_attn.q_norm.weight"]).transpose(1, 2)  # per-head norm, before RoPE
        k = rms(k, weights[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        # Query head j reads kv head j // (nh // nkv) (repeat_interleave, not tile).
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = (q @ k.transpose(2, 3)) * hd**-0.5 + mask
        att = att.softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, nh * hd)
        x = x + o @ weights[p + "self_attn.o_proj.weight"].T
        h = rms(x, weights[p + "post_attention_layernorm.weight"])
        g = h @ weights[p + "mlp.gate_proj.weight"].T
        u = h @ weights[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ weights[p + "mlp.down_proj.weight"].T
    x = rms(x, weights["model.norm.weight"])
    head = weights["lm_head.weight"] if "lm_head.weight" in weights else weights["model.embed_tokens.weight"]
    logits = x @ head.T
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return logits, loss


def run_case(out_dir: Path, case: str, tied: bool, overrides: dict) -> dict:
    case_dir = out_dir / case
    case_dir.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(tied, overrides)
    # safetensors is the only format in transformers 5: save_pretrained no longer has
    # a safe_serialization parameter, and its **kwargs silently swallow one.
    # Drop generation_config.json, which holds only generate() defaults.
    model.save_pretrained(case_dir)
    (case_dir / "generation_config.json").unlink(missing_ok=True)

    ids = fixed_input_ids(model.config.vocab_size)
    model.eval()  # no dropout anywhere; eval only fixes the mode
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()

    params = dict(model.named_parameters(remove_duplicate=False))
    tensors = {
        "input_ids": ids.contiguous(),
        "logits": out.logits.detach().float().contiguous(),
        "loss": out.loss.detach().float().reshape(1).contiguous(),
    }
    for name in GRAD_NAMES + ([] if tied else UNTIED_EXTRA_GRADS):
        grad = params[name].grad
        assert grad is not None and grad.shape == params[name].shape, name
        tensors[f"grad.{name}"] = grad.detach().float().contiguous()
    save_file(tensors, str(case_dir / "expected.safetensors"), metadata={"format": "pt"})

    # Self-checks. (1) The saved model has lm_head.weight only when untied.
    saved = load_file(str(case_dir / "model.safetensors"))
    cfg_json = json.loads((case_dir / "config.json").read_text())
    assert ("lm_head.weight" in saved) == (not tied), sorted(saved)
    assert cfg_json["rope_parameters"]["rope_theta"] == 1_000_000.0, cfg_json
    # (2) Reloading with from_pretrained (config.json + safetensors only) gives the same logits.
    reloaded = Qwen3ForCausalLM.from_pretrained(case_dir, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        re_logits = reloaded(input_ids=ids, use_cache=False).logits
    assert torch.equal(re_logits, out.logits.detach()), "from_pretrained round trip changed the logits"
    # (3) The plain-torch re-implementation agrees.
    leaves = {k: v.clone().requires_grad_(True) for k, v in saved.items()}
    with torch.enable_grad():
        man_logits, man_loss = manual_forward(leaves, cfg_json, ids)
        man_loss.backward()
    man_diff = (man_logits - out.logits).abs().max().item()
    assert man_diff < 1e-4, f"manual forward differs by {man_diff}"
    assert abs(man_loss.item() - out.loss.item()) < 1e-5
    man_grad_diff = 0.0
    for key, want in tensors.items():
        if key.startswith("grad."):
            got = leaves[key.removeprefix("grad.")].grad
            man_grad_diff = max(man_grad_diff, (got - want).abs().max().item())
    assert man_grad_diff < 1e-4, f"manual backward differs by {man_grad_diff}"

    logits = out.logits.detach()
    return {
        "case": case,
        "loss": out.loss.item(),
        "logit_std": logits.std().item(),
        "logit_min": logits.min().item(),
        "logit_max": logits.max().item(),
        "manual_forward_max_abs_diff": man_diff,
        "manual_grad_max_abs_diff": man_grad_diff,
        "model_safetensors_keys": len(saved),
        "lm_head_in_model_safetensors": "lm_head.weight" in saved,
        "files": {f.name: f.stat().st_size for f in sorted(case_dir.iterdir())},
    }


# --------------------------------------------------------------------------------------
# LoRA parity fixture (PEFT)
# --------------------------------------------------------------------------------------

#: The adapter. Scale = LORA_ALPHA / LORA_R = 2 (not rsLoRA).
LORA_R = 4
LORA_ALPHA = 8
LORA_TARGETS = ["q_proj", "v_proj", "down_proj"]
#: Seed of the torch.Generator that re-draws every lora_A and lora_B.
LORA_SEED = 4321
#: lora_A ~ N(0, LORA_A_STD), lora_B ~ N(0, LORA_B_STD). B @ A * 2 then has a std of
#: about 2 * sqrt(r) * 0.1 * 0.05 = 0.02, next to the base weights' 0.15: a visible
#: change of the logits, so a wrong scale or a missed module shows.
LORA_A_STD = 0.1
LORA_B_STD = 0.05


def lora_config():
    from peft import LoraConfig

    return LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        target_modules=list(LORA_TARGETS),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def _in_memory_name(saved_name: str) -> str:
    """PEFT's file name of an adapter tensor -> its parameter name (adapter "default")."""
    for ab in ("lora_A", "lora_B"):
        if saved_name.endswith(f".{ab}.weight"):
            return saved_name.removesuffix(f".{ab}.weight") + f".{ab}.default.weight"
    raise AssertionError(f"not a lora tensor: {saved_name}")


def _merged_name(saved_name: str) -> str:
    """base_model.model.model.layers.0.mlp.down_proj.lora_A.weight -> model.layers.0.mlp.down_proj.weight"""
    stem = saved_name.removeprefix("base_model.model.")
    for ab in ("lora_A", "lora_B"):
        stem = stem.removesuffix(f".{ab}.weight")
    return stem + ".weight"


def run_lora_case(out_dir: Path) -> dict:
    import peft
    from peft import PeftModel, get_peft_model

    tied_dir, lora_dir = out_dir / "tied", out_dir / "lora"
    lora_dir.mkdir(parents=True, exist_ok=True)
    scale = LORA_ALPHA / LORA_R

    # The base is the tied case's model. Build it here (no path, so the adapter
    # config's base_model_name_or_path stays null and the files do not depend on how
    # --out was spelled) and check that it is what tied/ holds.
    base_saved = load_file(str(tied_dir / "model.safetensors"))
    cfg_json = json.loads((tied_dir / "config.json").read_text())
    model = build_tiny_model(True, CASES["tied"][1])
    base_params = dict(model.named_parameters())
    assert set(base_saved) == set(base_params), "tied/model.safetensors is not the tied model's parameters"
    for name, w in base_saved.items():
        assert torch.equal(base_params[name].detach(), w), f"tied/ is stale: {name} differs; run parity"

    pm = get_peft_model(model, lora_config())
    params = dict(pm.named_parameters())
    trainable = [n for n, p in params.items() if p.requires_grad]
    assert len(trainable) == 2 * 3 * TINY_CONFIG["num_hidden_layers"], trainable
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable), trainable
    gen = torch.Generator(device="cpu").manual_seed(LORA_SEED)
    with torch.no_grad():
        for name in trainable:  # named_parameters() order: layer, module, A then B
            p = params[name]
            std = LORA_A_STD if ".lora_A." in name else LORA_B_STD
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)

    ids = fixed_input_ids(cfg_json["vocab_size"])
    pm.eval()
    pm.zero_grad(set_to_none=True)
    with torch.enable_grad():
        out = pm(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
    for name, p in params.items():
        assert (p.grad is not None) == p.requires_grad, f"{name}: base must be frozen, adapter trained"
    with torch.no_grad(), pm.disable_adapter():
        base_logits = pm(input_ids=ids, use_cache=False).logits

    # PEFT's own files. README.md is a generated model card; drop it. PEFT keeps
    # target_modules as a set and writes list(set): its order follows the per-process
    # string hash (PYTHONHASHSEED), so sort every set-valued field first, for
    # byte-identical regeneration. Loading turns the list back into a set.
    peft_cfg = pm.peft_config["default"]
    for key, value in list(vars(peft_cfg).items()):
        if isinstance(value, set):
            setattr(peft_cfg, key, sorted(value))
    pm.save_pretrained(lora_dir)
    (lora_dir / "README.md").unlink(missing_ok=True)
    adapter = load_file(str(lora_dir / "adapter_model.safetensors"))
    assert all(".default." not in k for k in adapter), sorted(adapter)
    assert sorted(_in_memory_name(k) for k in adapter) == sorted(trainable), sorted(adapter)
    for k, w in adapter.items():
        assert w.dtype == torch.float32 and torch.equal(w, params[_in_memory_name(k)].detach()), k
    adapter_cfg = json.loads((lora_dir / "adapter_config.json").read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"]) == (LORA_R, LORA_ALPHA), adapter_cfg
    assert sorted(adapter_cfg["target_modules"]) == sorted(LORA_TARGETS), adapter_cfg
    assert not adapter_cfg["use_rslora"] and not adapter_cfg["use_dora"], adapter_cfg

    tensors = {
        "input_ids": ids.contiguous(),
        "logits": out.logits.detach().float().contiguous(),
        "loss": out.loss.detach().float().reshape(1).contiguous(),
    }
    for k in sorted(adapter):
        grad = params[_in_memory_name(k)].grad
        assert grad is not None and grad.shape == adapter[k].shape and grad.abs().max() > 0, k
        tensors[f"grad.{k}"] = grad.detach().float().contiguous()
    save_file(tensors, str(lora_dir / "expected.safetensors"), metadata={"format": "pt"})

    # Self-checks. (1) Loading the adapter back onto a fresh base gives the same logits.
    reloaded = PeftModel.from_pretrained(build_tiny_model(True, CASES["tied"][1]), lora_dir)
    reloaded.eval()
    with torch.no_grad():
        re_logits = reloaded(input_ids=ids, use_cache=False).logits
    assert torch.equal(re_logits, out.logits.detach()), "PeftModel.from_pretrained changed the logits"

    # (2) Plain torch on tied/ + the adapter file: W' = W + scale * B @ A.
    pairs = {}  # merged name -> (A name, B name) in the adapter file
    for k in adapter:
        pairs.setdefault(_merged_name(k), {})["A" if ".lora_A." in k else "B"] = k
    assert len(pairs) == len(adapter) // 2 and all(len(v) == 2 for v in pairs.values()), pairs
    leaves = {k: v.clone().requires_grad_(True) for k, v in adapter.items()}
    with torch.enable_grad():
        weights = dict(base_saved)
        for wname, ab in pairs.items():
            weights[wname] = base_saved[wname] + scale * (leaves[ab["B"]] @ leaves[ab["A"]])
        man_logits, man_loss = manual_forward(weights, cfg_json, ids)
        man_loss.backward()
    man_diff = (man_logits - out.logits).abs().max().item()
    assert man_diff < 1e-5, f"manual forward with W + (alpha/r) B A differs by {man_diff}"
    man_loss_diff = abs(man_loss.item() - out.loss.item())
    assert man_loss_diff < 1e-5, man_loss_diff
    man_grad_diff = max((leaves[k].grad - tensors[f"grad.{k}"]).abs().max().item() for k in adapter)
    assert man_grad_diff < 1e-5, f"manual adapter gradients differ by {man_grad_diff}"
    adapter_effect = (out.logits.detach() - base_logits).abs().max().item()
    assert adapter_effect > 0.1, f"the adapter barely changes the logits ({adapter_effect})"

    # (3) merge_and_unload (in place on the base: last) gives W + scale * B @ A.
    merged_model = pm.merge_and_unload()
    merged_state = merged_model.state_dict()
    merged = {}
    merge_diff = 0.0
    for wname, ab in sorted(pairs.items()):
        w = merged_state[wname].detach().float().contiguous()
        want = base_saved[wname] + scale * (adapter[ab["B"]] @ adapter[ab["A"]])
        merge_diff = max(merge_diff, (w - want).abs().max().item())
        merged[wname] = w
    assert merge_diff < 1e-6, f"merge_and_unload differs from W + (alpha/r) B A by {merge_diff}"
    with torch.no_grad():
        merged_logits = merged_model(input_ids=ids, use_cache=False).logits
    merged_logit_diff = (merged_logits - out.logits.detach()).abs().max().item()
    assert merged_logit_diff < 1e-5, merged_logit_diff
    save_file(merged, str(lora_dir / "merged.safetensors"), metadata={"format": "pt"})

    logits = out.logits.detach()
    return {
        "case": "lora",
        "peft": peft.__version__,
        "loss": out.loss.item(),
        "logit_std": logits.std().item(),
        "logit_min": logits.min().item(),
        "logit_max": logits.max().item(),
        "adapter_logit_effect_max_abs": adapter_effect,
        "manual_forward_max_abs_diff": man_diff,
        "manual_loss_abs_diff": man_loss_diff,
        "manual_grad_max_abs_diff": man_grad_diff,
        "merge_max_abs_diff": merge_diff,
        "merged_logits_max_abs_diff": merged_logit_diff,
        "files": {f.name: f.stat().st_size for f in sorted(lora_dir.iterdir())},
    }


def lora_versions(peft_version: str) -> dict:
    """The keys the LoRA case adds to versions.json."""
    return {
        "peft": peft_version,
        "lora": {
            "base": "tied",
            "r": LORA_R,
            "lora_alpha": LORA_ALPHA,
            "scale": LORA_ALPHA / LORA_R,
            "target_modules": sorted(LORA_TARGETS),
            "seed": LORA_SEED,
            "lora_A": f"N(0, {LORA_A_STD})",
            "lora_B": f"N(0, {LORA_B_STD})",
            "notes": [
                "base weights and config are tied/; lora/ holds only the adapter, expected and merged files",
                "lora/expected.safetensors: logits and loss of the PEFT model on the same input_ids, "
                "grad.<adapter tensor name> for every lora_A and lora_B (base frozen)",
                "lora/merged.safetensors: merge_and_unload() weights of the adapted linears, W + scale * B @ A",
            ],
        },
    }


def print_summary(s: dict) -> None:
    if s["case"] == "lora":
        print(
            f"{s['case']:>6}: loss {s['loss']:.6f}  logit std {s['logit_std']:.4f} "
            f"[{s['logit_min']:.3f}, {s['logit_max']:.3f}]  peft {s['peft']}  adapter changes logits by up to "
            f"{s['adapter_logit_effect_max_abs']:.3f}  manual (W + (alpha/r) B A) max|diff| "
            f"{s['manual_forward_max_abs_diff']:.2e}, loss {s['manual_loss_abs_diff']:.2e}, "
            f"grads {s['manual_grad_max_abs_diff']:.2e}  merge {s['merge_max_abs_diff']:.2e}, "
            f"merged logits {s['merged_logits_max_abs_diff']:.2e}"
        )
    else:
        print(
            f"{s['case']:>6}: loss {s['loss']:.6f}  logit std {s['logit_std']:.4f} "
            f"[{s['logit_min']:.3f}, {s['logit_max']:.3f}]  manual-forward max|diff| "
            f"{s['manual_forward_max_abs_diff']:.2e}, grads {s['manual_grad_max_abs_diff']:.2e}  lm_head in model.safetensors: "
            f"{s['lm_head_in_model_safetensors']}"
        )
    for name, size in s["files"].items():
        print(f"        {name:<26} {size:>9,} B")


def cmd_lora(args: argparse.Namespace) -> None:
    torch.manual_seed(0)  # PEFT's init of lora_A uses the global RNG; it is overwritten anyway
    torch.set_num_threads(1)
    out_dir = Path(args.out)
    summary = run_lora_case(out_dir)
    versions_path = out_dir / "versions.json"
    versions = json.loads(versions_path.read_text())
    versions.update(lora_versions(summary["peft"]))
    versions_path.write_text(json.dumps(versions, indent=2) + "\n")
    print_summary(summary)


def cmd_parity(args: argparse.Namespace) -> None:
    import peft  # the LoRA case needs it: fail before writing anything

    torch.manual_seed(0)  # nothing should depend on the global RNG, but pin it anyway
    torch.set_num_threads(1)  # one thread: bit-stable reductions when regenerating
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    summaries = [run_case(out_dir, case, tied, over) for case, (tied, over) in CASES.items()]
    summaries.append(run_lora_case(out_dir))  # after tied: its base is tied/

    versions = {
        "generator": "tools/lm/qwen3_reference.py parity",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "weight_seed": WEIGHT_SEED,
        "input_seed": INPUT_SEED,
        "init_std": INIT_STD,
        "norm_weight": f"1 + {NORM_JITTER} * N(0,1)",
        "input_ids_shape": [BATCH, SEQ],
        "attn_implementation": "eager",
        "dtype": "float32",
        "torch_threads": 1,
        "notes": [
            "loss = mean cross-entropy of logits[:, :-1] against input_ids[:, 1:] (labels = input_ids), "
            "over all B*(T-1) positions",
            "grads come from loss.backward() on that loss; in the tied case grad.model.embed_tokens.weight "
            "is the sum of the embedding-lookup and lm_head contributions",
        ],
        **lora_versions(peft.__version__),
    }
    (out_dir / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")

    total = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    for s in summaries:
        print_summary(s)
    print(f"total fixture size under {out_dir}: {total:,} B")


# --------------------------------------------------------------------------------------
# Bench
# --------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    config = Qwen3Config.from_json_file(args.config)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation=args.attn, dtype=torch.float32)
    model = model.float().train()
    n_params = sum(p.numel() for p in model.parameters())  # parameters() de-duplicates a tied head
    if args.lora_rank:
        # The peer of benches/lm.rs lora_train_step: PEFT LoRA on all seven linear modules,
        # lora_alpha = 2r, base frozen; only the adapter is optimised.
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=args.lora_rank,
                lora_alpha=2 * args.lora_rank,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                lora_dropout=0.0,
                bias="none",
                task_type="CAUSAL_LM",
            ),
        ).train()
    trainable = [p for p in model.parameters() if p.requires_grad]

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=gen, dtype=torch.int64)
    opt = torch.optim.AdamW(trainable, lr=1e-3) if args.optimizer == "adamw" else None

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        if opt is not None:
            opt.step()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - t0

    tokens = args.batch * args.seq * args.steps
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "threads": args.threads,
                "batch": args.batch,
                "seq": args.seq,
                "params": n_params,
                "trainable": sum(p.numel() for p in trainable),
                "lora_rank": args.lora_rank,
                "steps": args.steps,
                "seconds": round(seconds, 6),
                "tokens_per_s": round(tokens / seconds, 2),
                "ms_per_step": round(1000.0 * seconds / args.steps, 3),
                "optimizer": args.optimizer,
                "attn": args.attn,
            }
        )
    )


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------


def _encode_report(tok, text: str) -> dict:
    ids = tok.encode(text, add_special_tokens=False)
    ids_special = tok.encode(text, add_special_tokens=True)
    decoded = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return {
        "class": type(tok).__name__,
        "n_tokens": len(ids),
        "roundtrip": decoded == text,
        "ids": ids,
        "ids_with_special_tokens": ids_special if ids_special != ids else None,
    }


def cmd_tokenizer(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(args.tokenizer_json)
    # newline="" keeps "\r\n" as it is in the file: the Rust side must read the same text.
    with open(args.text_file, encoding="utf-8", newline="") as f:
        full = f.read()
    text = full if args.max_chars is None else full[: args.max_chars]

    report = {
        "tokenizer_json": str(path),
        "text_file": str(args.text_file),
        "max_chars": args.max_chars,
        "n_chars": len(text),  # Unicode scalar values, not bytes
        "n_bytes": len(text.encode("utf-8")),
        "transformers": transformers.__version__,
    }
    report["fast"] = _encode_report(PreTrainedTokenizerFast(tokenizer_file=str(path)), text)

    report["auto"] = None
    if (path.parent / "tokenizer_config.json").is_file():
        auto = AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
        report["auto"] = _encode_report(auto, text)
        report["auto_ids_equal_fast"] = report["auto"]["ids"] == report["fast"]["ids"]
    print(json.dumps(report))


# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("parity", help="write the tied/untied/lora reference fixtures")
    p.add_argument("--out", required=True, help="output directory, e.g. crates/train/tests/fixtures/qwen3")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("lora", help="write only the LoRA (PEFT) fixture, on the existing tied one")
    p.add_argument("--out", required=True, help="the parity output directory, e.g. crates/train/tests/fixtures/qwen3")
    p.set_defaults(func=cmd_lora)

    p = sub.add_parser("bench", help="time forward+backward of a random float32 model on CPU")
    p.add_argument("--config", required=True, help="a Hugging Face config.json for Qwen3")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--steps", type=int, required=True, help="timed steps (after --warmup steps)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--optimizer", choices=["none", "adamw"], default="none", help="adamw: AdamW(lr=1e-3) step in the loop")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="attention implementation (HF default: sdpa)")
    p.add_argument("--lora-rank", type=int, default=0, help="train a PEFT LoRA adapter of this rank on all seven linear modules (0: every parameter)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tokenizer", help="print the ids of a text prefix as JSON")
    p.add_argument("--tokenizer-json", required=True)
    p.add_argument("--text-file", required=True)
    p.add_argument("--max-chars", type=int, default=None, help="first N characters (default: whole file)")
    p.set_defaults(func=cmd_tokenizer)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()

"""The NLD backbone in PyTorch: one set of weights, three modes selected by the attention mask.

The forward takes the new tokens, their positions, an explicit boolean attention mask
``[B, T, P + T]`` over (cached prefix, new tokens), the cached K/V of the prefix and a per-token
draft-adapter gate. It returns logits and the K/V of the new tokens; whether those K/V are
committed to a cache is the caller's decision (verify commits, drafting does not).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import NLDConfig, RopeConfig, yarn_attention_factor

KV = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies of plain RoPE, YaRN (NTK-by-parts) or Llama 3.1's scaling for one head."""
    if rope.rope_type == "llama3":
        return llama3_inv_freq(rope, head_dim)
    base = rope.rope_theta
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    inv_extra = 1.0 / pos_freqs
    if rope.rope_type != "yarn" or rope.factor <= 1.0:
        return inv_extra.float()
    inv_inter = 1.0 / (rope.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra_weight = (1 - ramp).double()
    return (inv_inter * (1 - extra_weight) + inv_extra * extra_weight).float()


def llama3_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Llama 3.1's inverse frequencies: long wavelengths divided by ``factor``, short ones kept, the band
    between interpolated. Computed in float32 with transformers' operations in its order, so the values are
    its own bit for bit (tests/models/test_architectures.py)."""
    inv = 1.0 / (rope.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    old = rope.original_max_position_embeddings
    low_wavelen, high_wavelen = old / rope.low_freq_factor, old / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Packing:
    """The real tokens of a right-padded ``[B, T]`` batch, as one ``[N]`` index into its ``B·T`` rows.

    Token-wise layers (projections, MLP, norms, the head) run on the ``N`` real tokens only, so
    rows of different lengths cost their own tokens, not the longest row's; attention alone runs
    in the padded layout (padding gets zero q/k/v, which no real query sees).
    """

    def __init__(self, index: torch.Tensor, batch: int, tokens: int):
        self.index, self.batch, self.tokens = index, batch, tokens

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` → ``[N, ...]``."""
        return x.reshape(self.batch * self.tokens, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` → ``[B, T, ...]`` (zeros at padding)."""
        out = x.new_zeros(self.batch * self.tokens, *x.shape[1:]).index_copy_(0, self.index, x)
        return out.view(self.batch, self.tokens, *x.shape[1:])


class GatedLinear(nn.Module):
    """A linear layer (with a bias only where the architecture has one: Qwen2's q/k/v) and an optional
    LoRA adapter applied only where ``gate`` is 1.

    NLD's draft adapter (``linear_spec_lora``) must change draft-mode tokens only; verification
    and the KV cache of committed tokens stay those of the base model.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.lora_A: nn.Linear | None = None
        self.lora_B: nn.Linear | None = None
        self.lora_scale = 0.0

    def attach_lora(self, rank: int, alpha: float) -> None:
        out_features, in_features = self.weight.shape
        p = self.weight
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=p.device, dtype=p.dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=p.device, dtype=p.dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.lora_scale = alpha / rank

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """``gate``: ``[..., 1]`` in {0, 1} (or None: base only), already in ``x``'s dtype.

        The base product is computed exactly as without an adapter (verify rows stay bit-identical
        to a gate-free forward); the delta is scaled on the rank-wide intermediate and added by one
        ``addmm``: on small models the adapter's cost is op dispatch, not FLOPs. (Gathering only the
        gated tokens was measured slower on CPU: more ops.)
        """
        y = F.linear(x, self.weight, self.bias)
        if self.lora_A is None or gate is None:
            return y
        low = F.linear(x, self.lora_A.weight) * (gate * self.lora_scale)
        return torch.addmm(y.reshape(-1, y.shape[-1]), low.reshape(-1, low.shape[-1]),
                           self.lora_B.weight.t()).view(y.shape)


class Attention(nn.Module):
    def __init__(self, cfg: NLDConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = GatedLinear(cfg.hidden_size, cfg.q_width, cfg.attention_bias)
        self.k_proj = GatedLinear(cfg.hidden_size, cfg.kv_width, cfg.attention_bias)
        self.v_proj = GatedLinear(cfg.hidden_size, cfg.kv_width, cfg.attention_bias)
        self.o_proj = GatedLinear(cfg.q_width, cfg.hidden_size)
        if cfg.qk_norm:  # Qwen3: every query and key head normalised over its head_dim values, before RoPE
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_scale: torch.Tensor | None,
                mask: torch.Tensor, past: KV | None, gate: torch.Tensor | None,
                packed: Packing | None = None) -> tuple[torch.Tensor, KV]:
        hd, n_kv = self.head_dim, self.n_kv
        group = self.n_heads // n_kv
        q, k, v = self.q_proj(x, gate), self.k_proj(x, gate), self.v_proj(x, gate)
        if packed is not None:  # back to the padded [B, T] layout for RoPE and attention
            q, k, v = packed.unpack(torch.cat([q, k, v], dim=-1)).split([q.shape[-1], k.shape[-1], v.shape[-1]], -1)
        B, T = q.shape[:2]
        q = q.reshape(B, T, self.n_heads, hd)
        k = k.reshape(B, T, n_kv, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.reshape(B, T, n_kv, hd).transpose(1, 2)
        cos_, sin_ = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos_ + rotate_half(q) * sin_
        k = k * cos_ + rotate_half(k) * sin_
        if q_scale is not None:
            q = q * q_scale
        # GQA without repeating K/V: fold the query heads of one KV head into the row dimension.
        qg = q.reshape(B, n_kv, group * T, hd)
        scale = hd ** -0.5
        scores_new = torch.matmul(qg, k.transpose(-1, -2)) * scale
        if past is not None:
            scores = torch.cat([torch.matmul(qg, past[0].transpose(-1, -2)) * scale, scores_new], dim=-1)
        else:
            scores = scores_new
        scores = scores.view(B, n_kv, group, T, -1).masked_fill(~mask[:, None, None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(B, n_kv, group * T, -1)
        if past is not None:
            n_past = past[0].shape[2]
            out = torch.matmul(probs[..., :n_past], past[1]) + torch.matmul(probs[..., n_past:], v)
        else:
            out = torch.matmul(probs, v)
        out = out.view(B, self.n_heads, T, hd).transpose(1, 2).reshape(B, T, self.n_heads * hd)
        if packed is not None:
            out = packed.pack(out)
        return self.o_proj(out, gate), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: NLDConfig):
        super().__init__()
        self.gate_proj = GatedLinear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = GatedLinear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = GatedLinear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x, gate)) * self.up_proj(x, gate), gate)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: NLDConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, q_scale, mask, past, gate, packed=None):
        h, kv = self.self_attn(self.input_layernorm(x), cos, sin, q_scale, mask, past, gate, packed)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x), gate)
        return x, kv


class Encoder(nn.Module):
    def __init__(self, cfg: NLDConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def is_adapter_key(name: str) -> bool:
    """True for the draft adapter's tensors (LoRA pairs, the draft MASK embedding), not the base model's."""
    return "lora_" in name or name == "draft_mask_embedding"


class NLDModel(nn.Module):
    """Tensor names match NLD checkpoints: ``encoder.*`` and ``diffusion_head.weight``."""

    def __init__(self, cfg: NLDConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.diffusion_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rope, cfg.head_dim), persistent=False)
        self.rope_scale = yarn_attention_factor(cfg.rope)
        self.has_draft_adapter = False
        self.draft_mask_embedding: nn.Parameter | None = None
        """Part of the draft adapter: the input vector of a MASK token in a draft-mode (gate 1) position,
        in place of its row of ``embed_tokens``. Draft-only, so a prompt that contains the MASK token
        still runs the base model's embedding (AR stays the base model's, token for token)."""

    def init_weights(self, seed: int = 0, std: float = 0.02) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if is_adapter_key(name):
                continue
            with torch.no_grad():
                if p.ndim == 1:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def attach_draft_adapter(self, rank: int, alpha: float, target_modules: tuple[str, ...] = ("o_proj",)) -> None:
        for name, module in self.named_modules():
            if isinstance(module, GatedLinear) and name.rsplit(".", 1)[-1] in target_modules:
                module.attach_lora(rank, alpha)
        self.has_draft_adapter = True

    def attach_draft_mask_embedding(self) -> None:
        """A trainable draft-mode MASK embedding, initialised to the MASK token's own row."""
        row = self.encoder.embed_tokens.weight[self.config.mask_token_id].detach().clone()
        self.draft_mask_embedding = nn.Parameter(row)
        self.has_draft_adapter = True

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attn_mask: torch.Tensor,
                past_kv: list[KV] | None = None, draft_gate: torch.Tensor | None = None,
                logit_index: torch.Tensor | None = None,
                token_index: torch.Tensor | None = None) -> tuple[torch.Tensor, list[KV]]:
        """Run the backbone.

        input_ids, position_ids: ``[B, T]``; attn_mask: bool ``[B, T, P + T]`` (True = attend),
        columns ``< P`` address the cached prefix; past_kv: per layer ``(k, v)`` of shape
        ``[B, n_kv, P, head_dim]`` (post-RoPE) or None when P = 0; draft_gate: ``[B, T]`` in {0, 1},
        where 1 applies the draft adapter; logit_index: optional ``[B, K]`` positions whose logits
        are wanted (default: all); token_index: optional ``[N]`` indices (into the ``B·T`` flattened
        positions) of the real tokens of a right-padded batch — token-wise layers then skip the
        padding (see :class:`Packing`) and logits come back as ``[N, V]``. Returns logits
        ``[B, T or K, V]`` (or ``[N, V]``) and the new tokens' K/V ``[B, n_kv, T, head_dim]``.
        """
        if token_index is not None and logit_index is not None:
            raise ValueError("token_index and logit_index cannot be combined")
        cfg = self.config
        x = self.encoder.embed_tokens(input_ids)
        if self.draft_mask_embedding is not None and draft_gate is not None:
            draft_mask = (input_ids == cfg.mask_token_id) & (draft_gate > 0)
            x = torch.where(draft_mask.unsqueeze(-1), self.draft_mask_embedding.to(x.dtype), x)
        freqs = position_ids.to(torch.float32).unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)
        sin = (emb.sin() * self.rope_scale).to(x.dtype)
        q_scale = None
        beta = cfg.rope.llama_4_scaling_beta
        if beta:
            period = cfg.rope.original_max_position_embeddings
            q_scale = (1 + beta * torch.log1p(torch.floor(position_ids.to(torch.float32) / period)))
            q_scale = q_scale[:, None, :, None].to(x.dtype)
        gate = draft_gate.unsqueeze(-1).to(x.dtype) if self.has_draft_adapter and draft_gate is not None else None
        packed = None
        if token_index is not None:
            packed = Packing(token_index, *input_ids.shape)
            x = packed.pack(x)
            gate = packed.pack(gate) if gate is not None else None
        present: list[KV] = []
        for i, layer in enumerate(self.encoder.layers):
            x, kv = layer(x, cos, sin, q_scale, attn_mask, past_kv[i] if past_kv is not None else None, gate,
                          packed)
            present.append(kv)
        x = self.encoder.norm(x)
        if logit_index is not None:
            x = torch.gather(x, 1, logit_index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return self.diffusion_head(x), present

"""Known bugs of chapter 5: rotary position embeddings (RoPE)."""

from grader.chapters import KnownBug

_POSITIONS_IGNORED = ("looks like token_positions is ignored and positions 0 .. T-1 are used instead; "
                      "rotate each token by its own position (offsets, gaps and any order are allowed)")
_LOW_PRECISION = ("looks like the angles are computed in the input's dtype: in float16, position times "
                  "frequency loses most of the angle; compute angles, cos and sin in float32")
_ONE_BASED_K = ("looks like k counts from 1: pair k turns by position * theta^(-2k/d) with "
                "k = 0 .. d/2 - 1, so pair 0 turns by the position itself (CS336's handout writes "
                "2(k-1)/d with k from 1)")
_SIN_CASE = ("looks like cos and sin are swapped: position 0 must leave a vector unchanged "
             "(cos 0 = 1 multiplies x, sin 0 = 0 multiplies its partner)")

BUGS = (
    # -- rope_angles -------------------------------------------------------------------
    KnownBug("rope_angles", "one-based-k", _ONE_BASED_K,
             "k = torch.arange(head_dim // 2, device=token_positions.device, dtype=torch.float32)",
             "k = torch.arange(1, head_dim // 2 + 1, device=token_positions.device, dtype=torch.float32)"),
    KnownBug("rope_angles", "exponent-k-over-d",
             "looks like the exponent is -k/d instead of -2k/d: the frequencies must fall from 1 "
             "to about 1/theta across the d/2 pairs",
             "frequencies = theta ** (-2 * k / head_dim)", "frequencies = theta ** (-k / head_dim)"),
    KnownBug("rope_angles", "k-doubled-twice",
             "looks like k runs over 0, 2, 4, ... and is doubled again: use theta^(-2k/d) with "
             "k = 0, 1, ..., d/2 - 1, or theta^(-j/d) with j = arange(0, d, 2), not both",
             "k = torch.arange(head_dim // 2, device=token_positions.device, dtype=torch.float32)",
             "k = torch.arange(0, head_dim, 2, device=token_positions.device, dtype=torch.float32)"),
    KnownBug("rope_angles", "positive-exponent",
             "looks like the frequencies are theta^(+2k/d), growing with k; they are the inverse, "
             "theta^(-2k/d) = 1 / theta^(2k/d)",
             "frequencies = theta ** (-2 * k / head_dim)", "frequencies = theta ** (2 * k / head_dim)"),
    KnownBug("rope_angles", "theta-hard-coded",
             "looks like the base is always 10000: use the theta argument (LLaMA 3 uses 500000)",
             "frequencies = theta ** (-2 * k / head_dim)", "frequencies = 10000.0 ** (-2 * k / head_dim)"),
    KnownBug("rope_angles", "one-angle-per-feature",
             "looks like there is one angle per feature (d of them); there is one per pair of "
             "features, so d/2 angles per token",
             "k = torch.arange(head_dim // 2, device=token_positions.device, dtype=torch.float32)",
             "k = torch.arange(head_dim, device=token_positions.device, dtype=torch.float32)"),
    KnownBug("rope_angles", "positions-in-half-precision",
             "looks like positions and frequencies are multiplied in float16: float16 holds integers "
             "exactly only up to 2048 (and nothing above 65504), so large positions lose their angle; "
             "cast the positions to float32 and multiply in float32",
             "return token_positions.to(torch.float32).unsqueeze(-1) * frequencies",
             "return (token_positions.to(torch.float16).unsqueeze(-1) * frequencies.half()).float()"),
    # -- apply_rope --------------------------------------------------------------------
    KnownBug("apply_rope", "rotates-backwards",
             "looks like the sign of sin is flipped, so each pair turns by -angle: "
             "out[2k] = x[2k] cos - x[2k+1] sin and out[2k+1] = x[2k] sin + x[2k+1] cos",
             "[even * cos - odd * sin, even * sin + odd * cos]",
             "[even * cos + odd * sin, -even * sin + odd * cos]"),
    KnownBug("apply_rope", "pairs-are-halves",
             "looks like the pairs are (x[k], x[k + d/2]), the rotate-half convention; apply_rope "
             "rotates adjacent pairs (x[2k], x[2k+1]) as Meta's LLaMA and CS336 do",
             "even, odd = pairs[..., 0], pairs[..., 1]",
             "even, odd = x.to(compute).chunk(2, dim=-1)"),
    KnownBug("apply_rope", "positions-ignored", _POSITIONS_IGNORED,
             "angles = rope_angles(token_positions, x.shape[-1], theta)",
             "angles = rope_angles(torch.arange(x.shape[-2], device=x.device), x.shape[-1], theta)"),
    KnownBug("apply_rope", "positions-as-offset",
             "looks like only the first position is read and the others are taken as consecutive "
             "(start + 0 .. T-1): positions may have gaps and come in any order, so rotate each "
             "token by its own entry of token_positions",
             "angles = rope_angles(token_positions, x.shape[-1], theta)",
             "angles = rope_angles(token_positions[..., :1] + torch.arange(x.shape[-2], device=x.device), "
             "x.shape[-1], theta)"),
    # Frequencies computed in place instead of with rope_angles, k from 1.
    KnownBug("apply_rope", "one-based-k", _ONE_BASED_K,
             "angles = rope_angles(token_positions, x.shape[-1], theta)",
             "angles = rope_angles(token_positions, x.shape[-1], theta) * theta ** (-2 / x.shape[-1])"),
    # The mirror of apply_rope_half's frequencies-interleaved: Hugging Face's
    # x * cos(emb) + rotate_every_two(x) * sin(emb) with emb = cat(freqs, freqs).
    KnownBug("apply_rope", "frequencies-concatenated",
             "looks like the angles are laid out as cat([a, a]) (the rotate-half convention's layout) "
             "while the features are paired side by side: both features of pair k (2k and 2k + 1) "
             "turn by pair k's angle, so repeat each angle in place, repeat_interleave(2) (this mix "
             "breaks RoPE's relative positions)",
             "rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)",
             "cos, sin = (torch.cat([t, t], dim=-1).unflatten(-1, (-1, 2)) for t in (cos, sin))\n"
             "    rotated = torch.stack([even * cos[..., 0] - odd * sin[..., 0], "
             "even * sin[..., 1] + odd * cos[..., 1]], dim=-1)"),
    KnownBug("apply_rope", "theta-not-passed",
             "looks like theta is not passed on, so the base is always 10000: "
             "call rope_angles(token_positions, d, theta)",
             "angles = rope_angles(token_positions, x.shape[-1], theta)",
             "angles = rope_angles(token_positions, x.shape[-1])"),
    KnownBug("apply_rope", "angles-in-input-dtype", _LOW_PRECISION,
             "angles = rope_angles(token_positions, x.shape[-1], theta)  # (..., T, d/2) float32",
             "angles = rope_angles(token_positions, x.shape[-1], theta).to(x.dtype)"),
    KnownBug("apply_rope", "cos-sin-swapped", _SIN_CASE,
             "cos, sin = angles.cos().to(compute), angles.sin().to(compute)",
             "sin, cos = angles.cos().to(compute), angles.sin().to(compute)"),
    KnownBug("apply_rope", "float32-output",
             "looks like the answer stays float32 for float16 inputs: compute in float32, then "
             "return the result in x's dtype (.to(x.dtype))",
             "return rotated.flatten(-2).to(x.dtype)", "return rotated.flatten(-2)"),
    # -- apply_rope_half ---------------------------------------------------------------
    KnownBug("apply_rope_half", "frequencies-interleaved",
             "looks like the angles are repeat_interleave'd (the layout of adjacent pairs) while "
             "the features are paired by halves: features k and k + d/2 share pair k's angle, "
             "so repeat the angles with cat([a, a]) (this mix breaks RoPE's relative positions)",
             "angles = torch.cat([angles, angles], dim=-1)",
             "angles = angles.repeat_interleave(2, dim=-1)"),
    KnownBug("apply_rope_half", "rotate-half-sign",
             "looks like rotate_half has the minus on the wrong half, so each pair turns by -angle: "
             "rotate_half(x) = cat(-x2, x1)",
             "rotated_half = torch.cat([-second, first], dim=-1)",
             "rotated_half = torch.cat([second, -first], dim=-1)"),
    KnownBug("apply_rope_half", "rotate-half-no-minus",
             "looks like rotate_half lacks its minus sign, which is no rotation at all: "
             "rotate_half(x) = cat(-x2, x1)",
             "rotated_half = torch.cat([-second, first], dim=-1)",
             "rotated_half = torch.cat([second, first], dim=-1)"),
    KnownBug("apply_rope_half", "pairs-are-adjacent",
             "looks like the features are split into even and odd ones; in the rotate-half convention "
             "the first half x[:d/2] and the second half x[d/2:] are the two members of the pairs",
             "first, second = x.to(compute).chunk(2, dim=-1)",
             "first, second = x.to(compute)[..., 0::2], x.to(compute)[..., 1::2]"),
    KnownBug("apply_rope_half", "positions-ignored", _POSITIONS_IGNORED,
             "angles = rope_angles(token_positions, x.shape[-1], theta)",
             "angles = rope_angles(torch.arange(x.shape[-2], device=x.device), x.shape[-1], theta)"),
    KnownBug("apply_rope_half", "angles-in-input-dtype", _LOW_PRECISION,
             "angles = rope_angles(token_positions, x.shape[-1], theta)  # (..., T, d/2)",
             "angles = rope_angles(token_positions, x.shape[-1], theta).to(x.dtype)"),
    KnownBug("apply_rope_half", "cos-sin-swapped", _SIN_CASE,
             "cos, sin = angles.cos().to(compute), angles.sin().to(compute)",
             "sin, cos = angles.cos().to(compute), angles.sin().to(compute)"),
    # -- adjacent_to_half_permutation --------------------------------------------------
    KnownBug("adjacent_to_half_permutation", "inverse",
             "looks like the inverse permutation: perm lists, for each place of the half layout, "
             "the adjacent feature it takes: the even features 0, 2, 4, ... first, then 1, 3, 5, ...",
             "return torch.cat([evens, evens + 1])",
             "return torch.stack([evens // 2, evens // 2 + head_dim // 2], dim=-1).flatten()"),
    KnownBug("adjacent_to_half_permutation", "odd-first",
             "looks like the odd features come first; the first member of each adjacent pair (the "
             "even features 0, 2, 4, ...) goes to the first half",
             "return torch.cat([evens, evens + 1])", "return torch.cat([evens + 1, evens])"),
    KnownBug("adjacent_to_half_permutation", "interleaved-back",
             "looks like the even and odd features are interleaved again, which gives 0, 1, 2, ...: "
             "concatenate them instead, evens then odds",
             "return torch.cat([evens, evens + 1])",
             "return torch.stack([evens, evens + 1], dim=-1).flatten()"),
    KnownBug("adjacent_to_half_permutation", "halves-overlap",
             "looks like the first half is 0 .. d/2 - 1 rather than the even features 0, 2, 4, ..., "
             "so indices repeat: perm = [0, 2, ..., d-2, 1, 3, ..., d-1]",
             "evens = torch.arange(0, head_dim, 2, device=device)",
             "evens = torch.arange(head_dim // 2, device=device)"),
    # -- rope_self_attention -----------------------------------------------------------
    KnownBug("rope_self_attention", "rope-on-values",
             "looks like the values are rotated too: RoPE turns queries and keys only, so that "
             "scores depend on relative positions and values keep their content",
             "q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)",
             "q, k, v = (apply_rope(t, positions, theta) for t in (q, k, v))"),
    KnownBug("rope_self_attention", "keys-not-rotated",
             "looks like only the queries are rotated: rotate the keys as well, so that q_m . k_n "
             "depends on m - n",
             "q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)",
             "q = apply_rope(q, positions, theta)"),
    KnownBug("rope_self_attention", "not-causal",
             "looks like there is no causal mask: token t may attend to tokens 0 .. t only",
             'weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)',
             "weights = torch.softmax(scores, dim=-1)"),
    KnownBug("rope_self_attention", "diagonal-blocked",
             "looks like the causal mask blocks the diagonal too (triu(..., diagonal=0)): a token "
             "must see itself, so block only the later tokens, triu(..., diagonal=1); token 0 then "
             "has a key and no NaN",
             ".triu(diagonal=1)", ".triu(diagonal=0)"),
    KnownBug("rope_self_attention", "scale-by-d-model",
             "looks like the scores are divided by sqrt(d_model) instead of sqrt(d), the width "
             "of one head",
             "scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)",
             "scores = q @ k.transpose(-2, -1) / math.sqrt(d_model)"),
    KnownBug("rope_self_attention", "positions-ignored", _POSITIONS_IGNORED,
             "if token_positions is None:\n        token_positions = torch.arange(length, device=x.device)",
             "token_positions = torch.arange(length, device=x.device)"),
    KnownBug("rope_self_attention", "positions-without-head-axis",
             "looks like token_positions (..., T) meets q and k (..., H, T, d) without a head "
             "axis, so it lines up with the heads; rotate with token_positions.unsqueeze(-2)",
             "positions = token_positions.unsqueeze(-2)", "positions = token_positions"),
    KnownBug("rope_self_attention", "rope-over-model-width",
             "looks like RoPE rotates the whole width d_model before the heads are split; rotate "
             "each head's d = d_model / num_heads features, with frequencies theta^(-2k/d)",
             "q, k = apply_rope(q, positions, theta), apply_rope(k, positions, theta)",
             "q, k = (apply_rope(t.transpose(-3, -2).flatten(-2), token_positions, theta)"
             ".unflatten(-1, (num_heads, head_dim)).transpose(-3, -2) for t in (q, k))"),
)

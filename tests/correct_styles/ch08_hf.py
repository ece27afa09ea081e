"""Chapter 8 in the manner of Hugging Face transformers' eager GPT-2 / Llama code.

_split_heads / _merge_heads helpers and an _attn method; the causal mask is a
boolean tril applied with torch.where and torch.finfo(dtype).min (never -inf);
the softmax runs in float32 (`softmax(..., dtype=torch.float32)`) and is cast
back to the values' dtype; the model builds position_ids with an unsqueeze(0);
the training loop uses CrossEntropyLoss on flattened labels and zeroes the
gradients after each optimizer step, as the Trainer does. The cache is GPT-2's
eager one: layer_past / present tuples, use_cache, past_key_values with
past_length = past_key_values[0][0].size(-2) and position_ids from there, and
greedy_search's torch.argmax on next_token_logits, input_ids grown with
torch.cat and only the last token fed once there is a past.
"""

import math

import torch
from torch import nn
from torch.nn import CrossEntropyLoss


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.embed_dim = d_model
        self.num_heads = num_heads
        self.head_dim = self.embed_dim // self.num_heads
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError(
                f"`embed_dim` must be divisible by num_heads (got `embed_dim`: {self.embed_dim} and "
                f"`num_heads`: {self.num_heads})."
            )
        self.ln1 = nn.LayerNorm(self.embed_dim)
        self.qkv = nn.Linear(self.embed_dim, 3 * self.embed_dim)
        self.proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.ln2 = nn.LayerNorm(self.embed_dim)
        inner_dim = 4 * self.embed_dim
        self.mlp = nn.Sequential(nn.Linear(self.embed_dim, inner_dim), nn.GELU(), nn.Linear(inner_dim, self.embed_dim))

    def _split_heads(self, tensor, num_heads, attn_head_size):
        """Splits hidden_size dim into attn_head_size and num_heads"""
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        return tensor.permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        """Merges attn_head_size dim and num_attn_heads dim into hidden_size"""
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / math.sqrt(value.size(-1))

        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = torch.ones((query_length, key_length), dtype=torch.bool, device=query.device).tril(
            diagonal=key_length - query_length
        )
        mask_value = torch.finfo(attn_weights.dtype).min
        # Need to be a tensor, otherwise we get error: `RuntimeError: expected scalar type float but found double`.
        # Need to be on the same device, otherwise `RuntimeError: ..., x and y to be on the same device`
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)

        # upcast to fp32
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(value.dtype)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def _forward(self, hidden_states, layer_past=None, use_cache=False):
        residual = hidden_states
        hidden_states = self.ln1(hidden_states)
        query, key, value = self.qkv(hidden_states).split(self.embed_dim, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)

        if layer_past is not None:
            past_key, past_value = layer_past
            key = torch.cat((past_key, key), dim=-2)
            value = torch.cat((past_value, value), dim=-2)

        if use_cache is True:
            present = (key, value)
        else:
            present = None

        attn_output, _ = self._attn(query, key, value)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.proj(attn_output)
        hidden_states = attn_output + residual

        residual = hidden_states
        hidden_states = self.ln2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return (hidden_states, present)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states)[0]

    def forward_with_cache(self, hidden_states, layer_past=None):
        return self._forward(hidden_states, layer_past=layer_past, use_cache=True)


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_position_embeddings = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([TransformerBlock(d_model, num_heads) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def _forward(self, input_ids, past_key_values=None, use_cache=False):
        input_shape = input_ids.size()
        device = input_ids.device
        if past_key_values is None:
            past_length = 0
            past_key_values = tuple([None] * len(self.blocks))
        else:
            past_length = past_key_values[0][0].size(-2)
        position_ids = torch.arange(past_length, input_shape[-1] + past_length, dtype=torch.long, device=device)
        position_ids = position_ids.unsqueeze(0)  # (1, seq_length)

        inputs_embeds = self.tok_emb(input_ids)
        position_embeds = self.pos_emb(position_ids)
        hidden_states = inputs_embeds + position_embeds

        presents = [] if use_cache else None
        for block, layer_past in zip(self.blocks, past_key_values):
            if use_cache is True:
                hidden_states, present = block.forward_with_cache(hidden_states, layer_past=layer_past)
                presents.append(present)
            else:
                hidden_states = block(hidden_states)

        hidden_states = self.ln_f(hidden_states)
        lm_logits = self.head(hidden_states)
        return lm_logits, presents

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        return self._forward(input_ids)[0]

    def forward_with_cache(self, input_ids, past_key_values=None):
        return self._forward(input_ids, past_key_values=past_key_values, use_cache=True)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens):
    past_key_values = None
    scores = ()
    for _ in range(max_new_tokens):
        model_inputs = input_ids if past_key_values is None else input_ids[:, -1:]
        logits, past_key_values = model.forward_with_cache(model_inputs, past_key_values)
        next_token_logits = logits[:, -1, :]
        scores += (next_token_logits,)
        next_tokens = torch.argmax(next_token_logits, dim=-1)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
    return input_ids, torch.stack(scores, dim=1)


def train(tokens, vocab_size, steps, context=32, batch_size=16, lr=1e-2, seed=0, d_model=32, num_heads=2,
          num_layers=1):
    torch.manual_seed(seed)
    model = TinyLM(vocab_size, d_model, num_heads, num_layers, context).to(tokens.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fct = CrossEntropyLoss()
    model.train()
    optimizer.zero_grad()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, tokens.size(0) - context, (batch_size,), device=tokens.device)
        batch = torch.stack([tokens[start:start + context + 1] for start in starts.tolist()])
        input_ids, labels = batch[:, :-1], batch[:, 1:]
        lm_logits = model(input_ids)
        loss = loss_fct(lm_logits.view(-1, lm_logits.size(-1)), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


# GPT-J's rotary embedding (Hugging Face's modeling_gptj): adjacent pairs, sin and cos
# repeated twice each, and rotate_every_two; keys rotated before they are cached.
def create_sinusoidal_positions(position_ids: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=position_ids.device) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", position_ids.float(), inv_freq).float()
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def apply_rotary_pos_emb(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    sin = torch.repeat_interleave(sin[None, None, :, :], 2, 3)
    cos = torch.repeat_interleave(cos[None, None, :, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


class RoPETransformerBlock(TransformerBlock):
    def __init__(self, d_model: int, num_heads: int, theta: float = 10000.0):
        super().__init__(d_model, num_heads)
        self.theta = theta

    def forward(self, x):
        return self.forward_with_cache(x)[0]

    def forward_with_cache(self, hidden_states, layer_past=None):
        residual = hidden_states
        query, key, value = self.qkv(self.ln1(hidden_states)).split(self.embed_dim, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)

        past_length = 0 if layer_past is None else layer_past[0].size(-2)
        position_ids = torch.arange(past_length, past_length + hidden_states.shape[1], device=hidden_states.device)
        sincos = create_sinusoidal_positions(position_ids, self.head_dim, self.theta)
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        query = apply_rotary_pos_emb(query, sin, cos)
        key = apply_rotary_pos_emb(key, sin, cos)

        if layer_past is not None:
            key = torch.cat((layer_past[0], key), dim=-2)
            value = torch.cat((layer_past[1], value), dim=-2)

        attn_output, _ = self._attn(query, key, value)
        hidden_states = self.proj(self._merge_heads(attn_output, self.num_heads, self.head_dim)) + residual
        hidden_states = hidden_states + self.mlp(self.ln2(hidden_states))
        return hidden_states, (key, value)


# Sampling as Hugging Face's logits warpers: temperature, then TopKLogitsWarper (the k-th
# largest from torch.topk), then TopPLogitsWarper (sorted ascending, remove while the running
# sum stays at or below 1 - top_p, keep at least one), then torch.multinomial.
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, seed=0):
    scores = logits / temperature
    filter_value = -float("Inf")
    if top_k is not None:
        top_k = min(max(top_k, 1), scores.size(-1))
        indices_to_remove = scores < torch.topk(scores, top_k)[0][..., -1, None]
        scores = scores.masked_fill(indices_to_remove, filter_value)
    if top_p is not None:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
        sorted_indices_to_remove[..., -1:] = 0  # min_tokens_to_keep = 1
        indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
        scores = scores.masked_fill(indices_to_remove, filter_value)
    probs = nn.functional.softmax(scores, dim=-1)
    generator = torch.Generator(device=logits.device)
    generator.manual_seed(seed)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)

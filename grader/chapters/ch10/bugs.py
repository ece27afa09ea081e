"""Known bugs of chapter 10: sliding-window masks, the rolling buffer with
attention sinks, and a streaming decode step with positions within the
cache.

Each is a one-line edit of the reference solution (``old`` to ``new``)
with the hint a student reads when their answer matches it; its lesson's
Pitfalls section names it in a ``<!-- known bugs: ... -->`` tag.
"""

from grader.chapters import KnownBug

_GPU_FAILURE = r"would (fail on|return a tensor on the CPU when run on) a GPU"
_SINKS_EVICTED = ("looks like the sinks are evicted like the other tokens (slot count % C, Mistral's ring "
                  "over the whole buffer): the first `sinks` slots hold tokens 0 .. sinks - 1 forever, and "
                  "only the C - sinks slots after them roll: slot sinks + (count - sinks) % (C - sinks)")

BUGS = (
    # -- sliding_window_mask -----------------------------------------------------------
    KnownBug("sliding_window_mask", "window-one-too-many",
             "looks like each query sees W + 1 keys: a window of W counts the query itself, so token p "
             "sees keys p - W + 1 .. p (j > p - W, as Hugging Face's sliding_window), not p - W .. p",
             "recent = keys > positions - window", "recent = keys >= positions - window"),
    KnownBug("sliding_window_mask", "window-one-too-few",
             "looks like each query sees W - 1 keys: a window of W counts the query itself and the "
             "W - 1 keys before it, so token p sees keys p - W + 1 .. p (j > p - W)",
             "recent = keys > positions - window", "recent = keys > positions - window + 1"),
    KnownBug("sliding_window_mask", "top-left",
             "looks like the mask is aligned top-left (query i at position i); here the L queries are "
             "the last L of the S tokens, so query i sits at position i + S - L (bottom-right, as "
             "chapter 4's causal_mask)",
             "torch.arange(query_len, device=device)[:, None] + (key_len - query_len)",
             "torch.arange(query_len, device=device)[:, None]"),
    KnownBug("sliding_window_mask", "sinks-ignored",
             "looks like the sinks are left out: keys 0 .. sinks - 1 stay visible to every later query, "
             "whatever the window (StreamingLLM's attention sinks)",
             "return causal & (recent | sink)", "return causal & recent"),
    KnownBug("sliding_window_mask", "sinks-see-the-future",
             "looks like the sinks are visible to every query, even those before them: a sink is one "
             "more key a query may see only if it is not in its future, causal & (window | sink)",
             "return causal & (recent | sink)", "return (causal & recent) | sink"),
    KnownBug("sliding_window_mask", "device-ignored",
             "looks like the device argument is ignored: create the mask on it (torch.arange(..., "
             "device=device)), or it lands on the CPU while the scores are on the GPU",
             "keys = torch.arange(key_len, device=device)[None, :]", "keys = torch.arange(key_len)[None, :]",
             error=_GPU_FAILURE),
    # -- rolling_cache_append ------------------------------------------------------------
    KnownBug("rolling_cache_append", "sinks-evicted", _SINKS_EVICTED,
             "slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)",
             "slot = count % capacity"),
    KnownBug("rolling_cache_append", "ring-without-sink-offset",
             "looks like the ring's slot lacks the sinks' offset ((count - sinks) % (C - sinks) counts "
             "from slot 0, overwriting the sinks): add sinks, slot sinks + (count - sinks) % (C - sinks)",
             "slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)",
             "slot = count if count < sinks else (count - sinks) % (capacity - sinks)"),
    KnownBug("rolling_cache_append", "ring-not-started-at-sinks",
             "looks like the ring counts tokens from 0 rather than from the first one after the sinks "
             "(sinks + count % (C - sinks)): token sinks must go to slot sinks, and each later token to "
             "the slot after the last one's, sinks + (count - sinks) % (C - sinks)",
             "slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)",
             "slot = count if count < sinks else sinks + count % (capacity - sinks)"),
    KnownBug("rolling_cache_append", "ring-as-large-as-the-buffer",
             "looks like the ring is taken as C slots long (% C): after the sinks only C - sinks slots "
             "are left, so the slot is sinks + (count - sinks) % (C - sinks)",
             "slot = count if count < sinks else sinks + (count - sinks) % (capacity - sinks)",
             "slot = count if count < sinks else sinks + (count - sinks) % capacity",
             error=r"index \d+ is out of bounds for dimension \d+ with size \d+"),
    KnownBug("rolling_cache_append", "values-not-written",
             "looks like only the key is written: the value buffer must get the new token's value at the "
             "same slot",
             "    v_cache[:, :, slot] = v_new[:, :, 0]\n", ""),
    # -- streaming_attention_step -------------------------------------------------------
    KnownBug("streaming_attention_step", "text-positions",
             "looks like the keys and the query are rotated by their positions in the text; StreamingLLM "
             "rotates them by their positions within the cache: the n held tokens in text order at "
             "0 .. n - 1, the query at n - 1 (the sinks' distance to the query then stays within the "
             "cache's size)",
             "evicted = max(count + 1 - capacity, 0)", "evicted = 0"),
    KnownBug("streaming_attention_step", "slot-order-positions",
             "looks like each key is rotated by its slot's index: once the ring has wrapped, slot order is "
             "not text order; the held tokens, taken in text order, are at positions 0 .. n - 1",
             "positions = torch.where(slot < sinks, slot, token - evicted)", "positions = slot"),
    KnownBug("streaming_attention_step", "keys-cached-rotated",
             "looks like the keys are stored rotated, then rotated again at every step; the cache holds "
             "unrotated keys (StreamingLLM caches keys before RoPE), rotated afresh each step by their "
             "current positions within the cache",
             "rolling_cache_append(k_cache, v_cache, k, v, count, sinks)",
             "rolling_cache_append(k_cache, v_cache, rotate(k, query_at), v, count, sinks)"),
    KnownBug("streaming_attention_step", "empty-slots-attended",
             "looks like the slots not yet written are attended to as well: before the buffer is full, "
             "mask the slots after the newest token (slot > count) out of the softmax",
             "scores.masked_fill(~held, float(\"-inf\"))", "scores"),
    KnownBug("streaming_attention_step", "sinks-not-passed",
             "looks like the sinks are evicted like the other tokens once the buffer is full: pass sinks "
             "on to rolling_cache_append (its default is 0), and check that it keeps the first sinks slots",
             "rolling_cache_append(k_cache, v_cache, k, v, count, sinks)",
             "rolling_cache_append(k_cache, v_cache, k, v, count)"),
    KnownBug("streaming_attention_step", "query-at-n",
             "looks like the query is rotated by position n (the number of held tokens) instead of n - 1: "
             "it is the newest of the n tokens at positions 0 .. n - 1",
             "query_at = torch.tensor([count - evicted], device=x_new.device)",
             "query_at = torch.tensor([count - evicted + 1], device=x_new.device)"),
)
